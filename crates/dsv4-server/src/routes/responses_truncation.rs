//! `truncation: "auto"` on `/v1/responses`: which of a conversation's oldest turns to drop so
//! its prompt fits the context and the cache ([`truncated`]).

use dsv4_chat::{Message, Role};

/// `truncation: "auto"`: the prompt of `messages` without as few of the oldest turns as make
/// it `fit`, and how many messages were dropped; `None` if even the last user turn does not
/// fit. System and developer messages stay; the rest is cut just before a user message, so
/// a tool call is never parted from its result.
pub(super) fn truncated(
    messages: &[Message],
    encode: impl Fn(Vec<Message>) -> Option<(String, Vec<u32>)>,
    fits: impl Fn(&[u32]) -> bool,
) -> Option<(Vec<u32>, usize)> {
    let kept_always = |m: &Message| matches!(m.role, Role::System | Role::Developer);
    let cuts: Vec<usize> = (1..messages.len())
        .filter(|&i| messages[i].role == Role::User)
        .collect();
    let cut_at = |at: usize| -> (Vec<Message>, usize) {
        let kept: Vec<Message> = messages
            .iter()
            .enumerate()
            .filter(|(i, m)| *i >= at || kept_always(m))
            .map(|(_, m)| m.clone())
            .collect();
        let dropped = messages.len() - kept.len();
        (kept, dropped)
    };
    let try_cut = |j: usize| {
        let (kept, dropped) = cut_at(cuts[j]);
        encode(kept)
            .map(|(_, prompt)| prompt)
            .filter(|p| fits(p))
            .map(|p| (p, dropped))
    };
    // Dropping more never lengthens the prompt: the first cut that fits, by bisection.
    let last = cuts.len().checked_sub(1)?;
    let mut best = try_cut(last)?;
    let (mut lo, mut hi) = (0, last);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match try_cut(mid) {
            Some(found) => {
                best = found;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per byte of each message's content and role.
    fn encode(messages: Vec<Message>) -> Option<(String, Vec<u32>)> {
        let text: String = messages
            .iter()
            .map(|m| format!("{:?}{}", m.role, m.content))
            .collect();
        Some((text.clone(), text.bytes().map(u32::from).collect()))
    }

    #[test]
    fn truncation_keeps_system_messages_and_calls_with_their_results() {
        let mut call = Message::new(Role::Assistant, "calling");
        call.tool_calls.push(dsv4_chat::message::HistoryToolCall {
            id: Some("call_1".into()),
            name: "f".into(),
            arguments: dsv4_chat::message::ToolArguments::Raw("{}".into()),
        });
        let mut result = Message::new(Role::Tool, "sunny");
        result.tool_call_id = Some("call_1".into());
        let messages = vec![
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, "first question, rather long"),
            call,
            result,
            Message::new(Role::User, "second"),
            Message::new(Role::Developer, "Mind the tools."),
            Message::new(Role::Assistant, "ok"),
            Message::new(Role::User, "third"),
        ];
        let whole = encode(messages.clone()).unwrap().1.len();
        let cuts = [1, 4, 7];
        for budget in 0..=whole {
            let fits = |p: &[u32]| p.len() <= budget;
            let got = truncated(&messages, encode, fits);
            // The fewest dropped, by trying every cut in order.
            let want = cuts.iter().find_map(|&at| {
                let kept: Vec<Message> = messages
                    .iter()
                    .enumerate()
                    .filter(|(i, m)| *i >= at || matches!(m.role, Role::System | Role::Developer))
                    .map(|(_, m)| m.clone())
                    .collect();
                let dropped = messages.len() - kept.len();
                let prompt = encode(kept).unwrap().1;
                fits(&prompt).then_some((prompt, dropped))
            });
            assert_eq!(got, want, "budget {budget}");
            if let Some((_, dropped)) = got {
                // Never between a call and its result: the call, its result and the first
                // question go together; the developer message stays.
                assert!([0, 3, 5].contains(&dropped), "{dropped}");
            }
        }
        let fits_all = |_: &[u32]| true;
        assert_eq!(
            truncated(&messages, encode, fits_all).map(|(_, d)| d),
            Some(0),
            "nothing is dropped when everything fits"
        );
        let none_fit = |_: &[u32]| false;
        assert_eq!(truncated(&messages, encode, none_fit), None);
    }
}
