//! Tests of the encoding pipeline steps: merging, ordering, dropping, and input errors.

use super::*;

fn conv(json: &str) -> Conversation {
    Conversation::from_json_str(json).expect("conversation parses")
}

fn turns_of(json: &str) -> Vec<Turn> {
    let mut t = merge_tool_messages(&conv(json).messages);
    sort_tool_results_by_call_order(&mut t);
    t
}

#[test]
fn tool_messages_merge_into_one_user_turn_with_following_user_text() {
    let t = turns_of(
        r#"[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"x","content":"r"},
            {"role":"user","content":"b"},{"role":"assistant","content":"c"},
            {"role":"tool","content":"r2"}]"#,
    );
    assert_eq!(
        t.len(),
        3,
        "user+tool+user merge; the last tool opens a new user turn"
    );
    assert_eq!(
        t[0].blocks.as_deref(),
        Some(
            &[
                Block::Text("a".into()),
                Block::ToolResult {
                    id: "x".into(),
                    content: "r".into()
                },
                Block::Text("b".into())
            ][..]
        )
    );
    assert_eq!(t[2].role, Role::User);
    assert_eq!(
        t[2].blocks.as_deref(),
        Some(
            &[Block::ToolResult {
                id: String::new(),
                content: "r2".into()
            }][..]
        )
    );
}

#[test]
fn results_follow_the_latest_call_order_and_unknown_ids_sort_first() {
    let t = turns_of(
        r#"[{"role":"assistant","tool_calls":[
              {"id":"a","function":{"name":"f","arguments":"{}"}},
              {"id":"b","function":{"name":"f","arguments":"{}"}},
              {"id":"c","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"C"},
            {"role":"tool","tool_call_id":"zz","content":"Z"},
            {"role":"tool","tool_call_id":"b","content":"B"},
            {"role":"tool","tool_call_id":"a","content":"A"}]"#,
    );
    let order: Vec<&str> = t[1]
        .blocks
        .iter()
        .flatten()
        .map(|b| match b {
            Block::ToolResult { content, .. } => content.as_str(),
            Block::Text(s) => s.as_str(),
        })
        .collect();
    assert_eq!(order, ["Z", "A", "B", "C"], "unknown id sorts as 0; stable");
}

#[test]
fn dropping_thinking_removes_old_reasoning_and_old_developer_turns() {
    let t = merge_tool_messages(
        &conv(
            r#"[{"role":"developer","content":"d"},{"role":"user","content":"u1"},
                {"role":"assistant","content":"a1","reasoning_content":"r1"},
                {"role":"user","content":"u2"},
                {"role":"assistant","content":"a2","reasoning_content":"r2"}]"#,
        )
        .messages,
    );
    let kept = drop_old_thinking(t);
    let roles: Vec<Role> = kept.iter().map(|t| t.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::User, Role::Assistant]
    );
    assert_eq!(kept[1].reasoning, None);
    assert_eq!(
        kept[3].reasoning.as_deref(),
        Some("r2"),
        "after the last user: kept"
    );
}

#[test]
fn the_last_assistant_turn_shows_its_reasoning_in_thinking_mode() {
    let opts = EncodeOptions {
        thinking: true,
        ..EncodeOptions::default()
    };
    let prompt = encode_prompt(
        &conv(r#"[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"r"}]"#),
        &opts,
    )
    .unwrap();
    assert_eq!(
        prompt,
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>"
    );
}

#[test]
fn arguments_that_are_not_json_render_as_one_string_parameter() {
    let prompt = encode_prompt(
        &conv(r#"[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"oops {"}}]}]"#),
        &EncodeOptions { add_bos: false, ..EncodeOptions::default() },
    )
    .unwrap();
    assert_eq!(
        prompt,
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
         <｜DSML｜parameter name=\"arguments\" string=\"true\">oops {</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    );
}

#[test]
fn message_level_tools_and_response_format_render_in_the_system_prompt() {
    let prompt = encode_prompt(
        &conv(
            r#"[{"role":"system","content":"S","tools":[{"type":"function","function":{"name":"t"}}],
                 "response_format":{"type":"json_object"}},{"role":"user","content":"u"}]"#,
        ),
        &EncodeOptions::default(),
    )
    .unwrap();
    assert!(
        prompt.starts_with("<｜begin▁of▁sentence｜>S\n\n## Tools\n\n"),
        "{prompt}"
    );
    assert!(
        prompt.contains("### Available Tool Schemas\n\n{\"name\": \"t\"}\n\n"),
        "{prompt}"
    );
    assert!(
        prompt.ends_with(
            "tool calls.\n\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n\
             {\"type\": \"json_object\"}<｜User｜>u<｜Assistant｜></think>"
        ),
        "{prompt}"
    );
}

#[test]
fn request_tools_replace_the_first_message_tools_and_disable_dropping() {
    let c = conv(
        r#"{"messages":[{"role":"user","content":"u1"},
                        {"role":"assistant","content":"a","reasoning_content":"r"},
                        {"role":"user","content":"u2"}],
            "tools":[{"type":"function","function":{"name":"t"}}]}"#,
    );
    let opts = EncodeOptions {
        thinking: true,
        ..EncodeOptions::default()
    };
    let prompt = encode_prompt(&c, &opts).unwrap();
    assert!(
        prompt.contains("<｜User｜>u1<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>"),
        "{prompt}"
    );
    let empty = conv(r#"{"messages":[{"role":"user","content":"u"}],"tools":[]}"#);
    assert_eq!(
        encode_prompt(&empty, &EncodeOptions::default()).unwrap(),
        "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜></think>",
        "an empty tools list adds nothing"
    );
}

#[test]
fn bad_conversations_are_errors() {
    let none = Conversation::default();
    assert!(matches!(
        encode_prompt(&none, &EncodeOptions::default()),
        Err(EncodeError::NoMessages)
    ));
    let dev = conv(r#"[{"role":"developer","content":""}]"#);
    assert!(matches!(
        encode_prompt(&dev, &EncodeOptions::default()),
        Err(EncodeError::Message { index: 0, .. })
    ));
    for text in ["{", "3", r#"{"tools":[]}"#, r#"{"messages":{}}"#] {
        assert!(
            matches!(Conversation::from_json_str(text), Err(EncodeError::Json(_))),
            "{text}"
        );
    }
    let bad_tools = r#"{"messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":1}}}]}"#;
    assert!(matches!(
        Conversation::from_json_str(bad_tools),
        Err(EncodeError::Tools(_))
    ));
}

#[test]
fn reasoning_effort_maps_like_sglang() {
    assert_eq!(
        ReasoningEffort::from_request("max"),
        Some(ReasoningEffort::Max)
    );
    assert_eq!(
        ReasoningEffort::from_request("high"),
        Some(ReasoningEffort::High)
    );
    assert_eq!(ReasoningEffort::from_request("medium"), None);
    assert!("low".parse::<ReasoningEffort>().is_err());
}

#[test]
fn a_prefix_message_is_continued_as_the_reference_renders_wo_eos() {
    let opts = |thinking| EncodeOptions {
        thinking,
        ..Default::default()
    };
    let chat = r#"[{"role":"user","content":"Write code"},
                   {"role":"assistant","content":"```python\n","prefix":true}]"#;
    let closed = r#"[{"role":"user","content":"Write code"},
                     {"role":"assistant","content":"```python\n"}]"#;
    let chat_text = encode_prompt(&conv(chat), &opts(false)).unwrap();
    assert_eq!(
        chat_text,
        format!(
            "{BOS}{}Write code{ASSISTANT}{THINK_END}```python\n",
            crate::markers::USER
        )
    );
    // The same as the closed turn without its end-of-sentence token.
    let closed_text = encode_prompt(&conv(closed), &opts(false)).unwrap();
    assert_eq!(closed_text, format!("{chat_text}{}", crate::markers::EOS));
    // Thinking mode: the reasoning given is closed, the answer continues the content.
    let thinking = r#"[{"role":"user","content":"Q"},
        {"role":"assistant","reasoning_content":"easy","content":"A:","prefix":true}]"#;
    assert_eq!(
        encode_prompt(&conv(thinking), &opts(true)).unwrap(),
        format!(
            "{BOS}{}Q{ASSISTANT}{THINK_START}easy{THINK_END}A:",
            crate::markers::USER
        )
    );
}

#[test]
fn prefix_messages_that_cannot_be_continued_are_refused_naming_them() {
    for (json, index, says) in [
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b","prefix":true},
                {"role":"user","content":"c"}]"#,
            1,
            "must be the last",
        ),
        (
            r#"[{"role":"system","content":"s"},{"role":"assistant","content":"b","prefix":true}]"#,
            1,
            "must follow a user",
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b","prefix":true,
                "tool_calls":[{"id":"x","function":{"name":"f","arguments":"{}"}}]}]"#,
            1,
            "tool_calls",
        ),
    ] {
        match encode_prompt(&conv(json), &EncodeOptions::default()) {
            Err(EncodeError::Message { index: i, reason }) => {
                assert_eq!(i, index, "{json}");
                assert!(reason.contains(says), "{json}: {reason}");
            }
            other => panic!("{json}: expected a refusal, got {other:?}"),
        }
    }
    for (json, says) in [
        (
            r#"[{"role":"user","content":"a","prefix":true}]"#,
            "only an assistant",
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b","prefix":"yes"}]"#,
            "true or false",
        ),
    ] {
        let e = Conversation::from_json_str(json).unwrap_err().to_string();
        assert!(e.contains(says), "{json}: {e}");
    }
}
