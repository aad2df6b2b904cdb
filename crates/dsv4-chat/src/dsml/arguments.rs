//! A tool call's arguments as the model writes them ([`super::ParserOptions::stream_arguments`]):
//! the pieces of the OpenAI `arguments` text, sent while the invoke is read, whose
//! concatenation is exactly the text the finished call carries (`call.rs` builds that text:
//! `{"key": value, ...}` with Python's separators, a `string="true"` value as a JSON string, a
//! `string="false"` value as written with the whitespace around it trimmed).
//!
//! A `string="false"` value's whitespace is held until a later character shows it is not the
//! value's end, so a trimmed value never shows a space the final text lacks. Nothing is checked
//! here: a value that is not strict JSON, or arguments the tool's schema refuses, fail the
//! parse when the parameter or invoke closes, after its pieces were sent (as any streaming
//! parser of vLLM or SGLang does; a grammar-constrained answer cannot fail so).

use crate::pyjson::{write_python_str, write_python_str_body};

/// The arguments text of the invoke being read, piece by piece.
#[derive(Debug, Default)]
pub(crate) struct ArgumentStream {
    /// Parameters opened in this invoke.
    params: usize,
    /// The open parameter's value is a string (`string="true"`).
    string: bool,
    /// A `string="false"` value has shown a character other than whitespace.
    started: bool,
    /// Whitespace after such a value's last other character, held until more comes.
    held: String,
}

impl ArgumentStream {
    /// An invoke opens: the text's first piece.
    pub fn open_invoke(&mut self) -> &'static str {
        *self = Self::default();
        "{"
    }

    /// Parameter `key` opens: its separator, key and (for a string) opening quote.
    pub fn open_param(&mut self, key: &str, is_string: bool) -> String {
        let mut out = String::new();
        if self.params > 0 {
            out.push_str(", ");
        }
        self.params += 1;
        write_python_str(key, &mut out);
        out.push_str(": ");
        if is_string {
            out.push('"');
        }
        self.string = is_string;
        self.started = false;
        self.held.clear();
        out
    }

    /// One character of the open parameter's value, appended to `out` as far as it is known.
    pub fn value_char(&mut self, c: char, out: &mut String) {
        if self.string {
            write_python_str_body(c.encode_utf8(&mut [0; 4]), out);
        } else if c.is_ascii_whitespace() {
            if self.started {
                self.held.push(c);
            }
        } else {
            self.started = true;
            out.push_str(&self.held);
            self.held.clear();
            out.push(c);
        }
    }

    /// The open parameter closes: a string's closing quote (held whitespace is dropped).
    pub fn close_param(&mut self) -> &'static str {
        self.held.clear();
        if self.string { "\"" } else { "" }
    }

    /// The invoke closes: the text's last piece.
    pub fn close_invoke(&self) -> &'static str {
        "}"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_concatenate_to_the_call_text() {
        let mut a = ArgumentStream::default();
        let mut text = String::from(a.open_invoke());
        text.push_str(&a.open_param("city", true));
        for c in "Oslo \"N\"\n".chars() {
            a.value_char(c, &mut text);
        }
        text.push_str(a.close_param());
        text.push_str(&a.open_param("days", false));
        for c in " \n[1, 2] \t\n".chars() {
            a.value_char(c, &mut text);
        }
        text.push_str(a.close_param());
        text.push_str(a.close_invoke());
        assert_eq!(text, r#"{"city": "Oslo \"N\"\n", "days": [1, 2]}"#);
    }
}
