//! Order-preserving JSON values and their Python `json.dumps(value, ensure_ascii=False)` text.
//!
//! The DSV4 reference encoder (`encoding_dsv4.py`, see [`crate::encoding`]) writes tool schemas
//! and non-string tool arguments with Python's `json.dumps`: keys in the order they were given,
//! `", "` and `": "` separators, non-ASCII characters as they are. `serde_json::Value` sorts
//! object keys (the workspace does not enable `preserve_order`, and enabling it would change
//! every other crate), so this module keeps its own small value type.
//!
//! Numbers: integers print as written; floats print as Python's `repr` does (`1.0`, `1e-05`,
//! `1e+16`). Integers beyond 64 bits are read as floats by `serde_json` (no arbitrary
//! precision), so they print as floats where Python would print the integer.
//!
//! [`parse_value`] reads generated JSON (tool-call arguments) into a `serde_json::Value` for
//! schema checks, accepting numbers beyond the double range that `serde_json` alone refuses.

use std::fmt::{self, Write as _};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their keys in input order.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedJson {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, exactly as `serde_json` read it.
    Number(serde_json::Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<OrderedJson>),
    /// An object; a repeated key keeps its first position and its last value, as Python does.
    Object(Vec<(String, OrderedJson)>),
}

impl OrderedJson {
    /// Parses strict JSON text (RFC 8259: no comments, no trailing commas, no NaN).
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The value of `key` when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&OrderedJson> {
        match self {
            OrderedJson::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string when this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            OrderedJson::String(s) => Some(s),
            _ => None,
        }
    }

    /// A short name of the value's JSON type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            OrderedJson::Null => "null",
            OrderedJson::Bool(_) => "boolean",
            OrderedJson::Number(_) => "number",
            OrderedJson::String(_) => "string",
            OrderedJson::Array(_) => "array",
            OrderedJson::Object(_) => "object",
        }
    }

    /// The same value as a `serde_json::Value` (object key order is not kept there).
    pub fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            OrderedJson::Null => Value::Null,
            OrderedJson::Bool(b) => Value::Bool(*b),
            OrderedJson::Number(n) => Value::Number(n.clone()),
            OrderedJson::String(s) => Value::String(s.clone()),
            OrderedJson::Array(items) => Value::Array(items.iter().map(Self::to_value).collect()),
            OrderedJson::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect(),
            ),
        }
    }

    /// The text Python's `json.dumps(value, ensure_ascii=False)` writes for this value.
    pub fn to_python_json(&self) -> String {
        let mut out = String::new();
        self.write_python(&mut out);
        out
    }

    fn write_python(&self, out: &mut String) {
        match self {
            OrderedJson::Null => out.push_str("null"),
            OrderedJson::Bool(true) => out.push_str("true"),
            OrderedJson::Bool(false) => out.push_str("false"),
            OrderedJson::Number(n) => write_number(n, out),
            OrderedJson::String(s) => write_python_str(s, out),
            OrderedJson::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_python(out);
                }
                out.push(']');
            }
            OrderedJson::Object(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_python_str(k, out);
                    out.push_str(": ");
                    v.write_python(out);
                }
                out.push('}');
            }
        }
    }
}

/// Appends `s` as a JSON string the way Python's `json.dumps(s, ensure_ascii=False)` does.
pub fn write_python_str(s: &str, out: &mut String) {
    out.push('"');
    write_python_str_body(s, out);
    out.push('"');
}

/// `s` escaped as inside a JSON string Python's `json.dumps(s, ensure_ascii=False)` writes,
/// without the quotes: escaping is per character, so the pieces of a string escape to the
/// pieces of its escaped text.
pub fn write_python_str_body(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// `s` as Python's `json.dumps(s, ensure_ascii=False)` writes it.
pub fn python_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_python_str(s, &mut out);
    out
}

fn write_number(n: &serde_json::Number, out: &mut String) {
    if n.is_f64() {
        match n.as_f64() {
            Some(f) => out.push_str(&python_float_repr(f)),
            None => out.push_str(&n.to_string()),
        }
    } else {
        out.push_str(&n.to_string());
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional notation when the
/// decimal exponent is in -4..16, otherwise `d.ddde±XX`.
pub fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.5e-7" or "-1e20".
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            let zeros = "0".repeat(point.unsigned_abs() as usize);
            format!("{sign}0.{zeros}{digits}")
        } else {
            let point = point as usize;
            if digits.len() <= point {
                let zeros = "0".repeat(point - digits.len());
                format!("{sign}{digits}{zeros}.0")
            } else {
                format!("{sign}{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.unsigned_abs())
    }
}

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedJson;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<OrderedJson, E> {
        serde_json::Number::from_f64(v)
            .map(OrderedJson::Number)
            .ok_or_else(|| E::custom("a JSON number must be finite"))
    }

    fn visit_str<E>(self, v: &str) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(v))
    }

    fn visit_unit<E>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Null)
    }

    fn visit_none<E>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<OrderedJson, D::Error> {
        OrderedJson::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedJson, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(OrderedJson::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedJson, A::Error> {
        let mut fields: Vec<(String, OrderedJson)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, OrderedJson>()? {
            match fields.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => fields.push((key, value)),
            }
        }
        Ok(OrderedJson::Object(fields))
    }
}

/// Parses strict JSON text into a `serde_json::Value`. A number literal beyond the double
/// range (`1e400`, a 400-digit integer), which `serde_json` alone refuses and Python's
/// `json.loads` reads as infinity, becomes the largest finite double of its sign.
pub fn parse_value(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text).or_else(|first| {
        clamp_huge_numbers(text)
            .and_then(|clamped| serde_json::from_str(&clamped).ok())
            .ok_or(first)
    })
}

/// `text` with every JSON number literal whose value overflows a double replaced by
/// `±f64::MAX`; `None` when there is none (strings are skipped, escapes included).
fn clamp_huge_numbers(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut i, mut changed) = (0, 0, false);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &text[start..i];
                if is_json_number(literal) && literal.parse::<f64>().is_ok_and(f64::is_infinite) {
                    out.push_str(&text[copied..start]);
                    out.push_str(if literal.starts_with('-') {
                        "-1.7976931348623157e308"
                    } else {
                        "1.7976931348623157e308"
                    });
                    copied = i;
                    changed = true;
                }
            }
            _ => i += 1,
        }
    }
    changed.then(|| {
        out.push_str(&text[copied..]);
        out
    })
}

/// Whether `s` is exactly one RFC 8259 number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(s: &str) -> bool {
    let b = s.strip_prefix('-').unwrap_or(s).as_bytes();
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = match b.first() {
        Some(b'0') => 1,
        Some(b'1'..=b'9') => digits(1),
        _ => return false,
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return false;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return false;
        }
        i = end;
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(text: &str) -> String {
        OrderedJson::parse(text)
            .expect("valid JSON")
            .to_python_json()
    }

    #[test]
    fn objects_keep_key_order_and_use_python_separators() {
        assert_eq!(
            dumps(r#"{"z":1,"a":[true,null,"x"],"m":{"b":2,"a":1}}"#),
            r#"{"z": 1, "a": [true, null, "x"], "m": {"b": 2, "a": 1}}"#
        );
        assert_eq!(dumps("[]"), "[]");
        assert_eq!(dumps("{}"), "{}");
    }

    #[test]
    fn repeated_keys_keep_first_position_last_value() {
        assert_eq!(dumps(r#"{"a":1,"b":2,"a":3}"#), r#"{"a": 3, "b": 2}"#);
    }

    #[test]
    fn strings_escape_like_python_without_ascii_escaping() {
        assert_eq!(
            python_str("Zürich \"q\" \\ \n\t"),
            r#""Zürich \"q\" \\ \n\t""#
        );
        assert_eq!(python_str("\u{1}\u{8}\u{c}\r"), r#""\u0001\b\f\r""#);
        assert_eq!(python_str("日本 / <｜DSML｜>"), "\"日本 / <｜DSML｜>\"");
    }

    #[test]
    fn floats_print_like_python_repr() {
        for (f, py) in [
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.25e20, "1.25e+20"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float_repr(f), py, "{f}");
        }
        assert_eq!(dumps("[1.0, 2, -3, 1E2, 0.5]"), "[1.0, 2, -3, 100.0, 0.5]");
    }

    #[test]
    fn converts_to_serde_value() {
        let v = OrderedJson::parse(r#"{"b":[1,"x"],"a":null}"#).unwrap();
        assert_eq!(v.to_value(), serde_json::json!({"a": null, "b": [1, "x"]}));
        assert_eq!(v.get("b").map(OrderedJson::type_name), Some("array"));
        assert_eq!(v.get("zz"), None);
    }
}
