//! RFC 8785 JSON Canonicalization Scheme (JCS): the one byte form of a JSON
//! value that signatures cover, so signer and verifier agree whatever order
//! or spacing the JSON travelled in.
//!
//! - Object members are sorted by their names' UTF-16 code units (not by
//!   UTF-8 bytes or code points: the two differ above U+FFFF).
//! - Strings are escaped as ECMAScript's `JSON.stringify` does: `"`, `\`
//!   and the C0 controls only, with the short forms where they exist and
//!   lowercase `\u00xx` otherwise; everything else is written as UTF-8.
//! - Numbers are IEEE 754 doubles written as ECMAScript's
//!   `Number.prototype.toString` does (shortest round-trip digits, exponent
//!   from 1e21 and below 1e-6). An integer beyond 2^53 therefore loses
//!   precision, exactly as it does for every JCS implementation.

use serde_json::Value;

/// The canonical form of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n.as_f64().unwrap_or(0.0)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, member);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    // Runs that need no escape (nearly all of a record) are copied whole.
    let mut rest = s;
    // The characters escaped are all ASCII, so a byte found is a whole
    // character and the slices stay on character boundaries.
    while let Some(at) = rest
        .bytes()
        .position(|b| b == b'"' || b == b'\\' || b < 0x20)
    {
        out.push_str(&rest[..at]);
        let c = char::from(rest.as_bytes()[at]);
        rest = &rest[at + 1..];
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c => out.push_str(&format!("\\u{:04x}", c as u32)),
        }
    }
    out.push_str(rest);
    out.push('"');
}

/// ECMAScript Number::toString for a finite double (serde_json holds no
/// NaN or infinity).
fn write_number(out: &mut String, x: f64) {
    if x == 0.0 || !x.is_finite() {
        // -0 is written as 0.
        out.push('0');
        return;
    }
    if x < 0.0 {
        out.push('-');
    }
    // The shortest round-trip digits from ryu, as digits `d` and the
    // decimal exponent `n` with x = 0.d × 10^n (ECMAScript's k and n).
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(x.abs());
    let (mantissa, exp) = match text.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = format!("{int_part}{frac_part}");
    let leading = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0');
    let k = digits.len() as i32;
    let n = int_part.len() as i32 - leading as i32 + exp;
    if k <= n && n <= 21 {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(bits: u64) -> String {
        let mut s = String::new();
        write_number(&mut s, f64::from_bits(bits));
        s
    }

    /// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
    #[test]
    fn numbers_match_the_rfc_8785_appendix_b_samples() {
        let samples: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, want) in samples {
            assert_eq!(number(bits), want, "bits {bits:#018x}");
        }
    }

    /// RFC 8785 section 3.2.2: the serialisation example.
    #[test]
    fn the_rfc_8785_serialisation_example_canonicalises_as_published() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let value: Value = serde_json::from_str(input).expect("example parses");
        assert_eq!(
            canonical(&value),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 section 3.2.3: members sorted by UTF-16 code units, so the
    /// emoji (a surrogate pair starting 0xD83D) sorts before U+FB33.
    #[test]
    fn members_sort_by_utf16_code_units_as_in_rfc_8785() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let value: Value = serde_json::from_str(input).expect("example parses");
        let names: Vec<String> = match serde_json::from_str::<Value>(&canonical(&value)) {
            Ok(Value::Object(m)) => m.keys().cloned().collect(),
            other => panic!("not an object: {other:?}"),
        };
        assert_eq!(
            names,
            [
                "\r",
                "1",
                "\u{80}",
                "\u{f6}",
                "\u{20ac}",
                "\u{1f600}",
                "\u{fb33}"
            ]
        );
        assert!(canonical(&value).starts_with("{\"\\r\":\"Carriage Return\",\"1\":\"One\""));
    }

    #[test]
    fn order_and_spacing_of_the_input_do_not_change_the_form() {
        let a: Value =
            serde_json::from_str(r#"{"b": [1, 2.0, {"y": 1, "x": 2}], "a": "é"}"#).expect("parses");
        let b: Value =
            serde_json::from_str(r#"{"a":"é","b":[1.0,2,{"x":2,"y":1}]}"#).expect("parses");
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":"é","b":[1,2,{"x":2,"y":1}]}"#);
        let controls = Value::String("\u{1}\u{1f}\u{7f}/".into());
        assert_eq!(canonical(&controls), "\"\\u0001\\u001f\u{7f}/\"");
    }
}
