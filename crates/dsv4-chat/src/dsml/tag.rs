//! Attributes of DSML opening tags: the text between `<｜DSML｜invoke` (or `parameter`) and `>`.
//!
//! Grammar: `( WS+ KEY '="' VALUE '"' )* WS*` where KEY is ASCII letters, digits, `_` or `-`
//! and VALUE is any text without `"`. Each attribute needs whitespace before it. An invoke
//! tag takes only `name`; a parameter tag `name` and `string="true|false"`.

use super::error::{ErrorClass, ParseError};

/// One `key="value"` pair and its byte offset inside the tag text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attr {
    pub key: String,
    pub value: String,
    pub offset: usize,
}

/// The attributes of a tag body, or what is wrong with it (with the byte offset in `text`).
pub(crate) fn parse_attrs(text: &str) -> Result<Vec<Attr>, (usize, String)> {
    let bytes = text.as_bytes();
    let mut attrs: Vec<Attr> = Vec::new();
    let mut i = 0;
    loop {
        let ws_start = i;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            return Ok(attrs);
        }
        if i == ws_start {
            return Err((i, "attributes must be separated by whitespace".into()));
        }
        let key_start = i;
        while i < bytes.len()
            && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'-'))
        {
            i += 1;
        }
        let key = &text[key_start..i];
        if key.is_empty() {
            let found: String = text[i..].chars().take(12).collect();
            return Err((i, format!("expected an attribute name, found {found:?}")));
        }
        if !text[i..].starts_with("=\"") {
            return Err((
                i,
                format!("attribute `{key}` must be written {key}=\"...\""),
            ));
        }
        i += 2;
        let Some(len) = text[i..].find('"') else {
            return Err((key_start, format!("attribute `{key}` has no closing quote")));
        };
        let value = text[i..i + len].to_owned();
        if attrs.iter().any(|a| a.key == key) {
            return Err((key_start, format!("attribute `{key}` is given twice")));
        }
        attrs.push(Attr {
            key: key.to_owned(),
            value,
            offset: key_start,
        });
        i += len + 1;
    }
}

/// The `name` of an invoke tag, which takes no other attribute.
pub(crate) fn only_name(attrs: &[Attr], at: usize) -> Result<String, ParseError> {
    if let Some(other) = attrs.iter().find(|a| a.key != "name") {
        return Err(bad(
            at,
            format!("invoke tag has unknown attribute `{}`", other.key),
        ));
    }
    match attrs.iter().find(|a| a.key == "name") {
        Some(a) if !a.value.is_empty() => Ok(a.value.clone()),
        _ => Err(bad(at, "invoke tag needs a non-empty name=\"...\"")),
    }
}

/// The `name` and `string` flag of a parameter tag.
pub(crate) fn param_attrs(
    attrs: &[Attr],
    at: usize,
    body_at: impl Fn(usize) -> usize,
) -> Result<(String, bool), ParseError> {
    if let Some(other) = attrs.iter().find(|a| a.key != "name" && a.key != "string") {
        return Err(bad(
            body_at(other.offset),
            format!("parameter tag has unknown attribute `{}`", other.key),
        ));
    }
    let name = match attrs.iter().find(|a| a.key == "name") {
        Some(a) if !a.value.is_empty() => a.value.clone(),
        _ => return Err(bad(at, "parameter tag needs a non-empty name=\"...\"")),
    };
    let is_string = match attrs.iter().find(|a| a.key == "string") {
        Some(a) if a.value == "true" => true,
        Some(a) if a.value == "false" => false,
        Some(a) => {
            return Err(ParseError::new(
                ErrorClass::BadStringFlag,
                body_at(a.offset),
                format!(
                    "parameter `{name}` has string=\"{}\"; it must be \"true\" or \"false\"",
                    a.value
                ),
            ));
        }
        None => {
            return Err(ParseError::new(
                ErrorClass::BadStringFlag,
                at,
                format!("parameter `{name}` has no string=\"true|false\" attribute"),
            ));
        }
    };
    Ok((name, is_string))
}

fn bad(at: usize, message: impl Into<String>) -> ParseError {
    ParseError::new(ErrorClass::Malformed, at, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse_attrs(text)
            .unwrap()
            .into_iter()
            .map(|a| (a.key, a.value))
            .collect()
    }

    #[test]
    fn reads_attributes() {
        assert_eq!(
            pairs(r#" name="get weather" string="true""#),
            [
                ("name".into(), "get weather".into()),
                ("string".into(), "true".into())
            ]
        );
        assert_eq!(pairs("\n name=\"a>b\"\n"), [("name".into(), "a>b".into())]);
        assert!(pairs("").is_empty());
        assert!(pairs("  ").is_empty());
    }

    #[test]
    fn rejects_bad_attribute_syntax() {
        for (text, at) in [
            (r#"name="a""#, 0),
            (r#" name='a'"#, 5),
            (r#" name="a"string="b""#, 9),
            (r#" name="a" name="b""#, 10),
            (r#" ="a""#, 1),
            (r#" name="a"#, 1),
            (r#" name = "a""#, 5),
        ] {
            let (offset, msg) = parse_attrs(text).unwrap_err();
            assert_eq!(offset, at, "{text}: {msg}");
        }
    }
}
