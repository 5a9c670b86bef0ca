//! JSON in and out as OME's Go code sees it: Python's NaN/Infinity accepted on input, Go's
//! `encoding/json` escaping on output.

use serde::Serialize;
use serde_json::{Map, Value};

/// Replace the bare tokens `NaN`, `Infinity` and `-Infinity` outside strings, as upstream's
/// `SanitizeJSONBytes` does (Infinity → 1e308, -Infinity → -1e308, NaN → null) so Python-written
/// configs (Nemotron) parse. Unlike upstream's regexes this also handles adjacent values
/// (`[NaN, NaN]`) and never touches string contents.
pub fn sanitize_non_finite(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if let Some((token, replacement)) = non_finite_token_at(&input[i..]) {
            out.extend_from_slice(replacement);
            i += token;
            continue;
        }
        in_string = b == b'"';
        out.push(b);
        i += 1;
    }
    out
}

fn non_finite_token_at(rest: &[u8]) -> Option<(usize, &'static [u8])> {
    const TOKENS: [(&[u8], &[u8]); 3] = [(b"-Infinity", b"-1e308"), (b"Infinity", b"1e308"), (b"NaN", b"null")];
    for (token, replacement) in TOKENS {
        let whole_word = rest.get(token.len()).is_none_or(|c| !c.is_ascii_alphanumeric());
        if rest.starts_with(token) && whole_word {
            return Some((token.len(), replacement));
        }
    }
    None
}

/// Parse config bytes into a JSON object (after sanitising). Anything but an object is an error.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let clean = sanitize_non_finite(bytes);
    match serde_json::from_slice::<Value>(&clean) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

/// A non-empty string field.
pub fn str_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// A positive integer field; integral floats count (some exporters write `4096.0`), anything
/// else reads as absent rather than failing the whole config as Go's int fields would.
pub fn uint_field(obj: &Map<String, Value>, key: &str) -> Option<u64> {
    let v = obj.get(key)?;
    let n = v.as_u64().or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e18).map(|f| f as u64));
    n.filter(|n| *n > 0)
}

pub fn object_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key).and_then(Value::as_object)
}

/// Go's encoding/json also escapes `<`, `>`, `&`, U+2028 and U+2029; the rest of its escaping
/// (`\n`, `\b`, `\u001f`, ...) is serde_json's.
struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + std::io::Write>(&mut self, w: &mut W, fragment: &str) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            w.write_all(&fragment.as_bytes()[start..i])?;
            w.write_all(escape.as_bytes())?;
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// Serialise exactly as Go's `json.Marshal` would (field order is the type's).
pub fn to_go_json<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut ser).expect("metadata types always serialise");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}
