//! The DSML tool-call block as grammar rules: each tool's invoke with its parameters, written
//! exactly as the DSV4 encoder writes history tool calls, strict tools' arguments under their
//! JSON Schemas and, with `loose`, other tools' parameters free (see the module above).

use super::{GrammarCompiler, MAX_PARALLEL_CALLS, compact, lark_str};
use dsv4_chat::markers;
use dsv4_chat::pyjson::OrderedJson;
use dsv4_chat::tools::ToolDef;

/// Free text in a `string="true"` value: anything without the closing tag.
const STRING_VALUE: &str = r#"/(?s:.+)/ & ~/(?s:.*)<\/｜DSML｜parameter>(?s:.*)/"#;
impl GrammarCompiler {
    /// The rules of a tool-call block (`tool_block`) calling `tools`; with `loose`, only strict
    /// tools' arguments follow their schemas (the others take any parameters).
    pub(super) fn tool_calls(
        &self,
        tools: &[&ToolDef],
        parallel: bool,
        loose: bool,
    ) -> Result<String, String> {
        if tools.is_empty() {
            return Err("no tool to call".into());
        }
        let calls = if parallel {
            format!("call{{1,{MAX_PARALLEL_CALLS}}}")
        } else {
            "call".to_string()
        };
        let mut g = format!(
            "tool_block: {} \"\\n\" {calls} {}\n",
            self.marker(markers::TOOL_CALLS_START),
            self.marker(markers::TOOL_CALLS_END)
        );
        let names: Vec<String> = (0..tools.len()).map(|i| format!("tool_{i}")).collect();
        g.push_str(&format!("call: {}\n", names.join(" | ")));
        let mut any_loose = false;
        for (i, tool) in tools.iter().enumerate() {
            if loose && !tool.strict() {
                any_loose = true;
                g.push_str(&self.loose_invoke(i, tool));
            } else {
                g.push_str(&self.invoke(i, tool)?);
            }
        }
        if any_loose {
            g.push_str(&self.loose_param());
        }
        g.push_str(&format!("STRING_VALUE: {STRING_VALUE}\n"));
        Ok(g)
    }

    /// The rule of a non-strict tool's invoke: its name, then any parameters.
    fn loose_invoke(&self, i: usize, tool: &ToolDef) -> String {
        format!(
            "tool_{i}: {} {} loose_param* {} \"\\n\"\n",
            self.marker(markers::INVOKE_START),
            lark_str(&format!(" name=\"{}\">\n", tool.name())),
            self.marker(markers::INVOKE_END)
        )
    }

    /// Any parameter: a name, then raw text (`string="true"`) or any JSON value.
    fn loose_param(&self) -> String {
        let (start, end) = (
            self.marker(markers::PARAMETER_START),
            self.marker(markers::PARAMETER_END),
        );
        let name = lark_str(" name=\"");
        let text = lark_str("\" string=\"true\">");
        let json = lark_str("\" string=\"false\">");
        let any = compact(serde_json::json!({}));
        format!(
            "loose_param: {start} {name} PARAM_NAME {text} STRING_VALUE? {end} \"\\n\" \
             | {start} {name} PARAM_NAME {json} %json {any} {end} \"\\n\"\n\
             PARAM_NAME: /[^\"<>]+/\n"
        )
    }

    /// The rule of one tool's invoke and its parameters.
    fn invoke(&self, i: usize, tool: &ToolDef) -> Result<String, String> {
        let name = tool.name();
        let (props, required, defs) = object_shape(name, tool.function().get("parameters"))?;
        let mut rule = format!(
            "tool_{i}: {} {}",
            self.marker(markers::INVOKE_START),
            lark_str(&format!(" name=\"{name}\">\n"))
        );
        let mut params = String::new();
        for (j, (key, sub)) in props.iter().enumerate() {
            let optional = if required.contains(key) { "" } else { "?" };
            rule.push_str(&format!(" param_{i}_{j}{optional}"));
            let (flag, value) = if is_plain_string(sub) {
                ("true", "STRING_VALUE?".to_string())
            } else {
                let mut sub = sub.clone();
                if let (Some(obj), Some((k, d))) = (sub.as_object_mut(), defs.as_ref()) {
                    obj.insert(k.to_string(), d.clone());
                }
                ("false", format!("%json {}", compact(sub)))
            };
            params.push_str(&format!(
                "param_{i}_{j}: {} {} {value} {} \"\\n\"\n",
                self.marker(markers::PARAMETER_START),
                lark_str(&format!(" name=\"{key}\" string=\"{flag}\">")),
                self.marker(markers::PARAMETER_END),
            ));
        }
        rule.push_str(&format!(" {} \"\\n\"\n", self.marker(markers::INVOKE_END)));
        Ok(rule + &params)
    }
}

/// A tool's parameters as (properties in schema order, required names, shared definitions).
type Shape = (
    Vec<(String, serde_json::Value)>,
    Vec<String>,
    Option<(&'static str, serde_json::Value)>,
);

/// Keys a constrained tool's `parameters` may use (others cannot be enforced by the grammar).
const OBJECT_KEYS: [&str; 11] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "description",
    "title",
    "$schema",
    "$defs",
    "definitions",
    "$id",
    "strict",
];

/// Check that `schema` is a plain object schema the grammar can follow, and split it.
fn object_shape(tool: &str, schema: Option<&OrderedJson>) -> Result<Shape, String> {
    let fields = match schema {
        None | Some(OrderedJson::Null) | Some(OrderedJson::Bool(true)) => {
            return Ok((Vec::new(), Vec::new(), None));
        }
        Some(OrderedJson::Object(fields)) => fields,
        Some(_) => {
            return Err(format!(
                "tool `{tool}`: `parameters` must be an object schema"
            ));
        }
    };
    if let Some((k, _)) = fields
        .iter()
        .find(|(k, _)| !OBJECT_KEYS.contains(&k.as_str()))
    {
        return Err(format!(
            "tool `{tool}`: `parameters` uses `{k}`, which a DSML grammar cannot enforce; \
             constrained tool calls need a plain object schema (type, properties, required, \
             additionalProperties, $defs)"
        ));
    }
    let get = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    if get("type").is_some_and(|t| t.as_str() != Some("object")) {
        return Err(format!(
            "tool `{tool}`: `parameters` must have type \"object\""
        ));
    }
    let props: Vec<(String, serde_json::Value)> = match get("properties") {
        None => Vec::new(),
        Some(OrderedJson::Object(p)) => p.iter().map(|(k, v)| (k.clone(), v.to_value())).collect(),
        Some(_) => return Err(format!("tool `{tool}`: `properties` must be an object")),
    };
    if let Some(k) = props
        .iter()
        .map(|(k, _)| k)
        .find(|k| k.contains(['"', '<', '>']))
    {
        return Err(format!(
            "tool `{tool}`: parameter name {k:?} cannot be written as a DSML attribute (no '\"', \
             '<' or '>')"
        ));
    }
    let required: Vec<String> = match get("required") {
        None => Vec::new(),
        Some(OrderedJson::Array(r)) => r
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Some(_) => return Err(format!("tool `{tool}`: `required` must be an array")),
    };
    if let Some(k) = required
        .iter()
        .find(|k| !props.iter().any(|(p, _)| p == *k))
    {
        return Err(format!(
            "tool `{tool}`: required parameter `{k}` is not in `properties`"
        ));
    }
    let defs = ["$defs", "definitions"]
        .into_iter()
        .find_map(|k| get(k).map(|d| (k, d.to_value())));
    Ok((props, required, defs))
}

/// Whether a property is an unconstrained string (written as raw text, `string="true"`).
fn is_plain_string(sub: &serde_json::Value) -> bool {
    sub.as_object().is_some_and(|o| {
        o.get("type").is_some_and(|t| t == "string")
            && o.keys()
                .all(|k| matches!(k.as_str(), "type" | "description" | "title"))
    })
}
