//! Canonical JSON (RFC 8785, the JSON Canonicalization Scheme): the one spelling of a JSON
//! value that [`IdempotencyKey::for_tool_call`](crate::IdempotencyKey::for_tool_call) hashes,
//! so member order, whitespace, escapes and number spelling do not change a key. Members are
//! sorted by UTF-16 code units, strings minimally escaped, numbers printed as ECMAScript prints
//! the double. The rules in full, and why the walk is the crate's own: `docs/keys.md`.

use std::io;
use std::sync::OnceLock;

use serde_json::{Map, Number, Value};

/// Serializes `value` as RFC 8785 canonical JSON.
///
/// Object members are sorted by their names as UTF-16 code unit sequences, no whitespace is
/// written, strings are escaped minimally and numbers are printed as ECMAScript prints the
/// IEEE-754 double they denote (`i64` and `u64` values are converted to the nearest double first,
/// and `-0` prints as `0`). The same logical value always gives the same string, whatever order
/// its members were inserted in and however its numbers were spelled.
///
/// The walk uses an explicit stack, so arbitrarily deep values do not overflow the thread's
/// stack. To write the bytes somewhere without building the string (a hasher, a file), use
/// [`to_writer`].
///
/// # Examples
///
/// ```
/// use idempotent_retry::canonical;
/// use serde_json::json;
///
/// let args = json!({
///     "z": [1.0, -0.0, 1e21],
///     "a": "line\nbreak",
///     "\u{e000}": null,
///     "\u{1f600}": true,
/// });
/// assert_eq!(
///     canonical::to_string(&args),
///     "{\"a\":\"line\\nbreak\",\"z\":[1,0,1e+21],\"\u{1f600}\":true,\"\u{e000}\":null}"
/// );
/// ```
#[must_use]
pub fn to_string(value: &Value) -> String {
    let mut out = Vec::new();
    walk(value, &mut out);
    // Every byte written is either copied from a `&str` at char boundaries or ASCII.
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// Writes `value` as RFC 8785 canonical JSON (the bytes of [`to_string`]) to `writer`,
/// without building the string: a hasher wrapped as an [`io::Write`], a file, a socket.
///
/// The bytes go to `writer` in small pieces as the walk produces them (a token, a run of a
/// string); wrap a writer for which each call is costly in an [`io::BufWriter`].
///
/// # Errors
///
/// The first error `writer` returns; nothing more is written after it.
///
/// # Examples
///
/// ```
/// use idempotent_retry::canonical;
/// use serde_json::json;
///
/// let mut out = Vec::new();
/// canonical::to_writer(&json!({ "b": 2, "a": [1.0, "x"] }), &mut out)?;
/// assert_eq!(out, br#"{"a":[1,"x"],"b":2}"#);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn to_writer<W: io::Write + ?Sized>(value: &Value, writer: &mut W) -> io::Result<()> {
    let mut sink = IoSink {
        writer,
        failed: None,
    };
    walk(value, &mut sink);
    sink.failed.map_or(Ok(()), Err)
}

/// Where the walk puts the canonical bytes. Infallible, so the walk stays one loop; a sink
/// that can fail keeps its first error itself.
pub(crate) trait Sink {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);

    /// How many bytes have been written, if this sink can take bytes back
    /// ([`rewind`](Self::rewind)); `None` if it cannot.
    fn written(&self) -> Option<usize>;

    /// Takes back every byte written since [`written`](Self::written) returned `at`. Called
    /// only with a point that `written` returned.
    fn rewind(&mut self, at: usize);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn written(&self) -> Option<usize> {
        Some(self.len())
    }

    fn rewind(&mut self, at: usize) {
        self.truncate(at);
    }
}

/// An [`io::Write`] as a sink: the first error is kept and ends the writing.
struct IoSink<'w, W: io::Write + ?Sized> {
    writer: &'w mut W,
    failed: Option<io::Error>,
}

impl<W: io::Write + ?Sized> Sink for IoSink<'_, W> {
    fn put(&mut self, bytes: &[u8]) {
        if self.failed.is_none()
            && let Err(err) = self.writer.write_all(bytes)
        {
            self.failed = Some(err);
        }
    }

    /// Bytes handed to a writer are gone.
    fn written(&self) -> Option<usize> {
        None
    }

    fn rewind(&mut self, _at: usize) {
        unreachable!("a writer's sink never gives a point to rewind to");
    }
}

/// Writes `value` into `out`, iteratively.
pub(crate) fn walk(value: &Value, out: &mut impl Sink) {
    // Containers still being written, innermost last. Each holds the members it has yet to
    // write, so the stack grows with nesting depth, never with the call stack.
    let mut stack: Vec<Frame<'_>> = Vec::new();
    // The value to write next, if any; `None` means "continue with the innermost container".
    let mut next = Some(value);

    loop {
        if let Some(value) = next.take() {
            match value {
                Value::Null => out.put(b"null"),
                Value::Bool(true) => out.put(b"true"),
                Value::Bool(false) => out.put(b"false"),
                Value::Number(number) => write_number(out, number),
                Value::String(string) => write_string(out, string),
                Value::Array(items) => {
                    out.put(b"[");
                    stack.push(Frame::Array {
                        items: items.iter(),
                        first: true,
                    });
                }
                Value::Object(map) => {
                    let start = out.written();
                    out.put(b"{");
                    stack.push(Frame::Object {
                        members: Members::of(map, start.is_some()),
                        first: true,
                        start: start.unwrap_or(0),
                    });
                }
            }
        }

        let Some(frame) = stack.last_mut() else {
            break;
        };
        match frame {
            Frame::Array { items, first } => match items.next() {
                Some(item) => {
                    if !std::mem::replace(first, false) {
                        out.put(b",");
                    }
                    next = Some(item);
                }
                None => {
                    out.put(b"]");
                    stack.pop();
                }
            },
            Frame::Object {
                members,
                first,
                start,
            } => match members.next() {
                Some((name, member)) => {
                    if let Members::Trusted { map, .. } = members
                        && !orders_alike(name)
                    {
                        // The map's order may not be the canonical one after all: take the
                        // object back and write it sorted.
                        out.rewind(*start);
                        out.put(b"{");
                        *members = Members::sorted(map);
                        *first = true;
                        continue;
                    }
                    if !std::mem::replace(first, false) {
                        out.put(b",");
                    }
                    write_string(out, name);
                    out.put(b":");
                    next = Some(member);
                }
                None => {
                    out.put(b"}");
                    stack.pop();
                }
            },
        }
    }
}

/// A container whose opening bracket is written and whose members are not all written yet.
enum Frame<'a> {
    Array {
        items: std::slice::Iter<'a, Value>,
        first: bool,
    },
    Object {
        members: Members<'a>,
        first: bool,
        /// Where the object starts in the sink, when its members are `Trusted`.
        start: usize,
    },
}

/// An object's members in RFC 8785 order.
enum Members<'a> {
    /// The map's own order, when it is already the canonical one.
    InOrder(serde_json::map::Iter<'a>),
    /// The map's own order, byte order, trusted to be the canonical one: each name is checked
    /// as it is written ([`orders_alike`]), and the object is written again, sorted, from the
    /// first that is not (the sink takes back what was written of it).
    Trusted {
        members: serde_json::map::Iter<'a>,
        map: &'a Map<String, Value>,
    },
    /// Sorted into a list of their own.
    Sorted(std::vec::IntoIter<(&'a str, &'a Value)>),
}

impl<'a> Members<'a> {
    /// The members of `map` in RFC 8785 order: names compared as UTF-16 code unit sequences.
    ///
    /// This differs from UTF-8 byte order (and from `serde_json`'s `BTreeMap<String, _>`) only
    /// when a character above U+FFFF meets one in U+E000..=U+FFFF: as UTF-16 the former starts
    /// with a surrogate (0xD800..=0xDBFF) and sorts first, as UTF-8 it starts with 0xF0 and
    /// sorts last. Names with no byte from 0xEE up (the lead bytes of both ranges) order alike
    /// either way, so a map that iterates them in byte order (serde_json's default map does)
    /// is walked as it is, with nothing allocated; any other map (names with such characters,
    /// or the insertion order of serde_json's `preserve_order` feature) is sorted.
    ///
    /// When the sink can take bytes back (`rewindable`) and the map iterates in byte order,
    /// the names are not looked at here at all: they are `Trusted`, and checked one by one as
    /// they are written.
    fn of(map: &'a Map<String, Value>, rewindable: bool) -> Self {
        let in_byte_order = map_iterates_in_byte_order();
        if rewindable && in_byte_order {
            return Members::Trusted {
                members: map.iter(),
                map,
            };
        }
        let mut in_order = true;
        let mut bytewise = true;
        let mut previous: Option<&str> = None;
        for name in map.keys() {
            bytewise &= orders_alike(name);
            if !in_byte_order {
                in_order &= previous.is_none_or(|previous| previous < name.as_str());
                previous = Some(name);
            }
        }
        if in_order && bytewise {
            return Members::InOrder(map.iter());
        }
        Members::sorted(map)
    }

    /// The members of `map` sorted into a list of their own.
    fn sorted(map: &'a Map<String, Value>) -> Self {
        let bytewise = map.keys().all(|name| orders_alike(name));
        let mut members: Vec<(&str, &Value)> = map
            .iter()
            .map(|(name, value)| (name.as_str(), value))
            .collect();
        // Names are unique, so an unstable sort is deterministic.
        if bytewise {
            members.sort_unstable_by_key(|&(name, _)| name);
        } else {
            members.sort_unstable_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
        }
        Members::Sorted(members.into_iter())
    }
}

/// Whether serde_json's `Map` iterates its names in byte order, as its default `BTreeMap`
/// does: then no object needs its order checked name by name. Its `preserve_order` feature
/// (which any crate in the build can turn on) keeps insertion order instead. Asked once per
/// process, of a map built for the purpose.
fn map_iterates_in_byte_order() -> bool {
    static IN_BYTE_ORDER: OnceLock<bool> = OnceLock::new();
    *IN_BYTE_ORDER.get_or_init(|| {
        let mut map = Map::new();
        map.insert("b".to_owned(), Value::Null);
        map.insert("a".to_owned(), Value::Null);
        map.keys().next().is_some_and(|first| first == "a")
    })
}

/// Whether `name` sorts among other names the same way as UTF-8 bytes and as UTF-16 code
/// units: it has no byte from 0xEE up ([`Members::of`] says why).
fn orders_alike(name: &str) -> bool {
    name.is_ascii() || name.bytes().all(|byte| byte < 0xEE)
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Members::InOrder(members) | Members::Trusted { members, .. } => {
                members.next().map(|(name, value)| (name.as_str(), value))
            }
            Members::Sorted(members) => members.next(),
        }
    }
}

/// 2^53: up to this magnitude every integer is a double, and every integral double an `i64`.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;
/// [`EXACT_INTEGERS`] as the integer types serde_json keeps integers in.
const EXACT_UNSIGNED: u64 = 1 << 53;
const EXACT_SIGNED: i64 = 1 << 53;

/// Appends `number` as ECMAScript's `Number.prototype.toString` prints the nearest double.
fn write_number(out: &mut impl Sink, number: &Number) {
    // An integer a double holds exactly prints as its decimal digits, the double's as well as
    // its own: straight to itoa, without the round trip through a double below.
    if let Some(unsigned) = number.as_u64()
        && unsigned <= EXACT_UNSIGNED
    {
        out.put(itoa::Buffer::new().format(unsigned).as_bytes());
        return;
    }
    if let Some(signed) = number.as_i64()
        && (-EXACT_SIGNED..=EXACT_SIGNED).contains(&signed)
    {
        out.put(itoa::Buffer::new().format(signed).as_bytes());
        return;
    }
    // `as` rounds an integer to the nearest double (ties to even), as RFC 8785 wants for
    // integers beyond 2^53.
    let double = if let Some(unsigned) = number.as_u64() {
        Some(unsigned as f64)
    } else if let Some(signed) = number.as_i64() {
        Some(signed as f64)
    } else {
        number.as_f64()
    };
    match double.filter(|double| double.is_finite()) {
        // An integral double of at most 2^53 in magnitude is an `i64` exactly, and ECMAScript
        // prints it as its plain decimal digits (`-0` as `0`): itoa's output, at a fraction of
        // a float formatter's cost. Tool arguments are mostly such integers.
        Some(double) if double.fract() == 0.0 && double.abs() <= EXACT_INTEGERS => {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "an integral double within 2^53 converts exactly"
            )]
            let integer = double as i64;
            out.put(itoa::Buffer::new().format(integer).as_bytes());
        }
        Some(double) => match short_decimal(double) {
            // A short decimal (`1.25`, `0.1`, `19.99`): its digits are known without a
            // formatter.
            Some((digits, places)) => write_short_decimal(out, double < 0.0, digits, places),
            // ryu-js prints both zeros as `0`, integers below 1e21 without exponent or
            // fraction, and `e+`/`e-` exponents elsewhere, exactly as ECMAScript does.
            None => out.put(ryu_js::Buffer::new().format_finite(double).as_bytes()),
        },
        // Unreachable with serde_json's default features: a `Number` always holds a finite
        // `u64`, `i64` or `f64`. Only the `arbitrary_precision` feature can hold text with no
        // finite double (such as `1e400`); RFC 8785 has no spelling for it, so keep its text.
        None => out.put(number.to_string().as_bytes()),
    }
}

/// The most decimal places [`short_decimal`] tries, and their powers of ten (exact as doubles).
const SHORT_PLACES: usize = 6;
const POWERS_OF_TEN: [f64; SHORT_PLACES + 1] = [1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6];
const INTEGER_POWERS_OF_TEN: [u64; SHORT_PLACES + 1] =
    [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000];
/// 10^15: decimals with fewer significant digits than this never share a double.
const FIFTEEN_DIGITS: f64 = 1e15;

/// The shortest round-trip spelling of a `double` that is a decimal of at most
/// [`SHORT_PLACES`] places and 15 significant digits (`1.25`, `0.1`, `19.99`, `-0.000004`):
/// its significant digits as an integer without trailing zeros, and its number of places.
/// `None` for any other double (integers included), which the float formatter then prints.
///
/// The digits are found with one multiplication per place tried and proved with a division:
/// `digits / 10^places`, correctly rounded, is `double` itself, so this decimal reads back as
/// `double`. No other decimal of at most 15 significant digits reads back as the same double
/// (a double carries 15.95 decimal digits; C calls the 15 `DBL_DIG`), so none with fewer
/// digits does and none with as many: these are the digits ECMAScript's `Number::toString`
/// chooses, the shortest that round-trip. Such a number is at least 10^-6 and below 10^15,
/// where ECMAScript writes it as plain decimals (`0.000004`, never `4e-6`).
fn short_decimal(double: f64) -> Option<(u64, usize)> {
    let magnitude = double.abs();
    for places in 1..=SHORT_PLACES {
        let scaled = magnitude * POWERS_OF_TEN[places];
        // A finite double times 10^6 is at most infinite, never NaN.
        if scaled >= FIFTEEN_DIGITS {
            return None;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a non-negative double below 10^15 truncates to a u64; the check below \
                      keeps only one that was already an integer"
        )]
        let digits = scaled as u64;
        #[allow(
            clippy::cast_precision_loss,
            reason = "an integer below 10^15 is a double exactly"
        )]
        let exact = digits as f64;
        if exact == scaled && exact / POWERS_OF_TEN[places] == magnitude {
            // An integer is not a short decimal (and has its own path).
            if digits.is_multiple_of(INTEGER_POWERS_OF_TEN[places]) {
                return None;
            }
            // The product can miss a shorter spelling that the division would have proved
            // (`x * 10` not rounding to the integer it is close to): drop the zeros it left.
            let (mut digits, mut places) = (digits, places);
            while digits.is_multiple_of(10) {
                digits /= 10;
                places -= 1;
            }
            return Some((digits, places));
        }
    }
    None
}

/// Appends the decimal `digits / 10^places` (`places` at least 1, the number not an integer),
/// negative if `negative`, as ECMAScript writes it: the whole part, a point, every place.
fn write_short_decimal(out: &mut impl Sink, negative: bool, digits: u64, places: usize) {
    if negative {
        out.put(b"-");
    }
    let unit = INTEGER_POWERS_OF_TEN[places];
    out.put(itoa::Buffer::new().format(digits / unit).as_bytes());
    let mut fraction = digits % unit;
    let mut text = [b'.'; SHORT_PLACES + 1];
    for place in (1..=places).rev() {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "a remainder of a division by ten is one digit"
        )]
        let digit = (fraction % 10) as u8;
        text[place] = b'0' + digit;
        fraction /= 10;
    }
    out.put(&text[..=places]);
}

/// For each byte, the escape RFC 8785 gives it: 0 for none, `u` for `\u00xx`, otherwise the
/// character written after the backslash. One lookup a byte, as serde_json's own writer does.
static ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Appends `string` as a JSON string literal with RFC 8785's minimal escapes: `\"`, `\\`,
/// `\b`, `\f`, `\n`, `\r`, `\t`, the other C0 controls as `\u00xx`, everything else as is.
fn write_string(out: &mut impl Sink, string: &str) {
    out.put(b"\"");
    let bytes = string.as_bytes();
    // Start of the run of bytes that need no escape and are not yet written.
    let mut run_start = 0;
    while let Some(index) = next_escape(bytes, run_start) {
        // Every escaped byte is ASCII, so the run ends at a char boundary.
        out.put(&bytes[run_start..index]);
        let byte = bytes[index];
        let escape = ESCAPES[usize::from(byte)];
        if escape == b'u' {
            push_unicode_escape(out, byte);
        } else {
            out.put(&[b'\\', escape]);
        }
        run_start = index + 1;
    }
    out.put(&bytes[run_start..]);
    out.put(b"\"");
}

/// The index of the first byte of `bytes` from `from` on that needs an escape, if any.
///
/// Eight bytes at a time while none of them does ([`word_needs_escape`]), then byte by byte:
/// most strings need no escape at all, or few.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    for word in bytes[from..].chunks_exact(8) {
        let word = u64::from_le_bytes(word.try_into().expect("chunks of eight bytes"));
        if word_needs_escape(word) {
            break;
        }
        at += 8;
    }
    // From the first word that needs an escape (which holds one), or from the tail.
    bytes[at..]
        .iter()
        .position(|&byte| ESCAPES[usize::from(byte)] != 0)
        .map(|offset| at + offset)
}

/// Whether any of the eight bytes of `word` needs an escape: a C0 control (below 0x20), `"`
/// or `\`. Exact: the borrows of the subtractions can only mark bytes above one that needs
/// an escape, never make one up in a word that has none.
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte below `n` (at most 0x80) leaves its high bit set in `word - n` and clear in
    // `word`; a zero byte does so for `n` = 1.
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word;
    let quotes = word ^ (ONES * u64::from(b'"'));
    let backslashes = word ^ (ONES * u64::from(b'\\'));
    (below(word, 0x20) | below(quotes, 1) | below(backslashes, 1)) & HIGHS != 0
}

/// Appends a C0 control byte as a lowercase `\u00xx` escape.
fn push_unicode_escape(out: &mut impl Sink, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(&[
        b'\\',
        b'u',
        b'0',
        b'0',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 0x0f)],
    ]);
}

#[cfg(test)]
mod tests {
    use super::to_string as canonical_json;
    use proptest::prelude::*;
    use serde_json::{Map, Number, Value, json};

    fn number(double: f64) -> Value {
        Value::from(double)
    }

    #[test]
    fn integral_doubles_print_without_fraction() {
        assert_eq!(canonical_json(&number(1.0)), "1");
        assert_eq!(canonical_json(&number(-1.0)), "-1");
        assert_eq!(canonical_json(&number(100.0)), "100");
        assert_eq!(canonical_json(&number(123_456_789_012.0)), "123456789012");
    }

    #[test]
    fn negative_zero_prints_as_zero() {
        assert_eq!(canonical_json(&number(-0.0)), "0");
        assert_eq!(canonical_json(&number(0.0)), "0");
        let parsed: Value = serde_json::from_str("-0.0").unwrap();
        assert_eq!(canonical_json(&parsed), "0");
        let parsed: Value = serde_json::from_str("-0").unwrap();
        assert_eq!(canonical_json(&parsed), "0");
    }

    #[test]
    fn exponents_follow_ecmascript() {
        assert_eq!(canonical_json(&number(1e21)), "1e+21");
        assert_eq!(canonical_json(&number(1e20)), "100000000000000000000");
        assert_eq!(canonical_json(&number(1e-7)), "1e-7");
        assert_eq!(canonical_json(&number(0.000001)), "0.000001");
        assert_eq!(canonical_json(&number(1.5e-7)), "1.5e-7");
        assert_eq!(canonical_json(&number(-1e30)), "-1e+30");
        assert_eq!(canonical_json(&number(4.5)), "4.5");
        assert_eq!(canonical_json(&number(0.1 + 0.2)), "0.30000000000000004");
        assert_eq!(canonical_json(&number(f64::MAX)), "1.7976931348623157e+308");
        assert_eq!(
            canonical_json(&number(f64::MIN_POSITIVE)),
            "2.2250738585072014e-308"
        );
        assert_eq!(canonical_json(&number(5e-324)), "5e-324");
    }

    /// Sample lines from the cyberphone ES6 number test file (`testdata/README.md`).
    #[test]
    fn es6_number_samples() {
        let samples: [(u64, &str); 7] = [
            (0x4340_0000_0000_0001, "9007199254740994"),
            (0x4340_0000_0000_0002, "9007199254740996"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x8000_0000_0000_0000, "0"),
            (0, "0"),
        ];
        for (bits, expected) in samples {
            assert_eq!(
                canonical_json(&number(f64::from_bits(bits))),
                expected,
                "{bits:016x}"
            );
        }
    }

    #[test]
    fn large_integers_round_to_nearest_double() {
        let two_53_plus_1: u64 = (1 << 53) + 1;
        assert_eq!(
            canonical_json(&Value::from(two_53_plus_1)),
            "9007199254740992"
        );
        assert_eq!(
            canonical_json(&Value::from(-(two_53_plus_1 as i64))),
            "-9007199254740992"
        );
        assert_eq!(
            canonical_json(&Value::from(u64::MAX)),
            "18446744073709552000"
        );
        assert_eq!(
            canonical_json(&Value::from(i64::MIN)),
            "-9223372036854776000"
        );
        assert_eq!(
            canonical_json(&Value::from(i64::MAX)),
            "9223372036854776000"
        );
        // The same double, however it was spelled, prints the same.
        let parsed: Value =
            serde_json::from_str("[9007199254740993, 9007199254740992.0, 9.007199254740992e15]")
                .unwrap();
        assert_eq!(
            canonical_json(&parsed),
            "[9007199254740992,9007199254740992,9007199254740992]"
        );
    }

    #[test]
    fn every_control_character_is_escaped_minimally() {
        let short = [
            (0x08, "\\b"),
            (0x09, "\\t"),
            (0x0a, "\\n"),
            (0x0c, "\\f"),
            (0x0d, "\\r"),
        ];
        for byte in 0x00u8..=0x1f {
            let expected = match short.iter().find(|(b, _)| *b == byte) {
                Some((_, escape)) => (*escape).to_owned(),
                None => format!("\\u{byte:04x}"),
            };
            let input = Value::String(format!("a{}b", char::from(byte)));
            assert_eq!(
                canonical_json(&input),
                format!("\"a{expected}b\""),
                "byte {byte:#04x}"
            );
        }
        assert_eq!(canonical_json(&json!("\u{1f}")), "\"\\u001f\"");
        assert_eq!(canonical_json(&json!("\u{0}\u{0}")), "\"\\u0000\\u0000\"");
    }

    #[test]
    fn quote_and_backslash_are_escaped() {
        assert_eq!(
            canonical_json(&json!("say \"hi\" \\o/")),
            r#""say \"hi\" \\o/""#
        );
    }

    #[test]
    fn nothing_else_is_escaped() {
        for text in [
            "/",
            "</script>",
            "\u{7f}",
            "\u{80}",
            "\u{2028}\u{2029}",
            "\u{e000}",
            "\u{fffd}",
            "\u{1f600}",
            "caf\u{e9}",
            "cafe\u{301}",
            " ",
            "'",
        ] {
            assert_eq!(
                canonical_json(&Value::String(text.to_owned())),
                format!("\"{text}\""),
                "{text:?}"
            );
        }
    }

    #[test]
    fn strings_are_not_normalized() {
        let composed = canonical_json(&json!("\u{e9}"));
        let decomposed = canonical_json(&json!("e\u{301}"));
        assert_ne!(composed, decomposed);
    }

    #[test]
    fn member_names_sort_as_utf16_code_units() {
        // U+1F600 is the surrogate pair D83D DE00 in UTF-16, below U+E000, although its UTF-8
        // (F0 ...) sorts after U+E000's (EE ...).
        let mut map = Map::new();
        map.insert("\u{e000}".to_owned(), json!(1));
        map.insert("\u{1f600}".to_owned(), json!(2));
        map.insert("\u{ffff}".to_owned(), json!(3));
        map.insert("z".to_owned(), json!(4));
        map.insert("\u{d7ff}".to_owned(), json!(5));
        assert_eq!(
            canonical_json(&Value::Object(map)),
            "{\"z\":4,\"\u{d7ff}\":5,\"\u{1f600}\":2,\"\u{e000}\":1,\"\u{ffff}\":3}"
        );
    }

    #[test]
    fn member_names_sort_by_code_unit_not_locale() {
        let value = json!({ "b": 1, "B": 2, "a": 3, "": 4, "aa": 5, "\n": 6, "10": 7, "9": 8 });
        assert_eq!(
            canonical_json(&value),
            "{\"\":4,\"\\n\":6,\"10\":7,\"9\":8,\"B\":2,\"a\":3,\"aa\":5,\"b\":1}"
        );
    }

    #[test]
    fn member_names_are_escaped() {
        let value = json!({ "a\"b": 1, "c\u{1}": 2 });
        assert_eq!(canonical_json(&value), "{\"a\\\"b\":1,\"c\\u0001\":2}");
    }

    #[test]
    fn scalars() {
        assert_eq!(canonical_json(&Value::Null), "null");
        assert_eq!(canonical_json(&json!(true)), "true");
        assert_eq!(canonical_json(&json!(false)), "false");
        assert_eq!(canonical_json(&json!("")), "\"\"");
    }

    #[test]
    fn empty_containers() {
        assert_eq!(canonical_json(&json!({})), "{}");
        assert_eq!(canonical_json(&json!([])), "[]");
        assert_eq!(canonical_json(&json!([[], {}, [{}]])), "[[],{},[{}]]");
        assert_eq!(
            canonical_json(&json!({ "a": {}, "b": [] })),
            "{\"a\":{},\"b\":[]}"
        );
    }

    #[test]
    fn nested_values() {
        let value = json!({
            "b": [1, { "y": null, "x": [true, false] }, "s"],
            "a": { "d": { "f": 1.5, "e": -2 }, "c": [] },
        });
        assert_eq!(
            canonical_json(&value),
            "{\"a\":{\"c\":[],\"d\":{\"e\":-2,\"f\":1.5}},\"b\":[1,{\"x\":[true,false],\"y\":null},\"s\"]}"
        );
    }

    #[test]
    fn member_order_and_number_spelling_do_not_matter() {
        let one: Value = serde_json::from_str(r#"{"a": 1, "b": [2, 3e0]}"#).unwrap();
        let two: Value = serde_json::from_str(r#"{ "b" : [ 2.0, 3 ], "a" : 1.00 }"#).unwrap();
        assert_eq!(canonical_json(&one), "{\"a\":1,\"b\":[2,3]}");
        assert_eq!(canonical_json(&one), canonical_json(&two));
    }

    const DEEP: usize = 100_000;

    /// Drops `value` without recursion: `serde_json`'s own drop recurses once per nesting level and
    /// would overflow the test thread's stack on the deep values below. Dismantling keeps these
    /// tests on the default stack, which also shows `canonical_json` itself needs no big stack.
    fn dismantle(value: Value) {
        let mut pending = vec![value];
        while let Some(mut value) = pending.pop() {
            match &mut value {
                Value::Array(items) => pending.append(items),
                Value::Object(map) => {
                    pending.extend(std::mem::take(map).into_iter().map(|(_, v)| v))
                }
                _ => {}
            }
        }
    }

    #[test]
    fn deeply_nested_arrays_do_not_overflow_the_stack() {
        let mut value = Value::Null;
        for _ in 0..DEEP {
            value = Value::Array(vec![value]);
        }
        let text = canonical_json(&value);
        dismantle(value);
        assert_eq!(text.len(), 2 * DEEP + 4);
        assert!(text.starts_with(&"[".repeat(DEEP)));
        assert_eq!(&text[DEEP..DEEP + 4], "null");
        assert!(text.ends_with(&"]".repeat(DEEP)));
    }

    #[test]
    fn deeply_nested_objects_do_not_overflow_the_stack() {
        let mut value = json!(1);
        for _ in 0..DEEP {
            let mut map = Map::new();
            map.insert("b".to_owned(), Value::Bool(true));
            map.insert("a".to_owned(), value);
            value = Value::Object(map);
        }
        let text = canonical_json(&value);
        dismantle(value);
        let expected = format!("{}1{}", "{\"a\":".repeat(DEEP), ",\"b\":true}".repeat(DEEP));
        assert!(text == expected, "deep object output differs");
    }

    /// Replaces every number by the double it denotes, the only thing RFC 8785 keeps of it.
    fn normalize_numbers(value: &Value) -> Value {
        match value {
            Value::Number(number) => number
                .as_f64()
                .and_then(Number::from_f64)
                .map_or(Value::Null, Value::Number),
            Value::Array(items) => Value::Array(items.iter().map(normalize_numbers).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(name, value)| (name.clone(), normalize_numbers(value)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// A finite double that `serde_json` reads back exactly from its shortest spelling.
    ///
    /// `serde_json` without its `float_roundtrip` feature may parse a 17-digit spelling one unit in
    /// the last place off, which is a limit of the test's parser, not of the canonical form;
    /// `numbers_round_trip_through_an_exact_parser` covers every double with std's exact parser.
    fn json_double() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            (-1_000_000i64..1_000_000, 0u32..8).prop_map(|(m, e)| m as f64 / 10f64.powi(e as i32)),
        ]
        .prop_filter("finite and read back exactly by serde_json", |double| {
            double.is_finite()
                && serde_json::from_str::<f64>(ryu_js::Buffer::new().format_finite(*double))
                    .is_ok_and(|back| back == *double)
        })
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            json_double().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[\\x00-\\x20\"\\\\/a\u{e000}\u{1f600}]{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        any::<String>(),
                        "[a-c\u{e000}\u{ffff}\u{10000}\u{1f600}]{0,3}"
                    ],
                    inner,
                    0..8
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// RFC 8785 the plain way, to hold the walk against: recursive, every object's members
    /// sorted by UTF-16 code units, every string escaped a character at a time.
    fn reference(value: &Value) -> String {
        match value {
            Value::String(text) => {
                let mut literal = String::from("\"");
                for c in text.chars() {
                    match c {
                        '"' => literal.push_str("\\\""),
                        '\\' => literal.push_str("\\\\"),
                        '\u{8}' => literal.push_str("\\b"),
                        '\t' => literal.push_str("\\t"),
                        '\n' => literal.push_str("\\n"),
                        '\u{c}' => literal.push_str("\\f"),
                        '\r' => literal.push_str("\\r"),
                        c if c < ' ' => literal.push_str(&format!("\\u{:04x}", u32::from(c))),
                        c => literal.push(c),
                    }
                }
                literal.push('"');
                literal
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reference).collect();
                format!("[{}]", items.join(","))
            }
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(name, member)| {
                        format!(
                            "{}:{}",
                            reference(&Value::String(name.clone())),
                            reference(member)
                        )
                    })
                    .collect();
                format!("{{{}}}", members.join(","))
            }
            leaf => canonical_json(leaf),
        }
    }

    /// The float formatter's spelling, which the short-decimal path must reproduce.
    fn formatted(double: f64) -> String {
        ryu_js::Buffer::new().format_finite(double).to_owned()
    }

    #[test]
    fn short_decimals_print_as_the_float_formatter_prints_them() {
        for (double, text) in [
            (1.25, "1.25"),
            (0.1, "0.1"),
            (0.3, "0.3"),
            (-19.99, "-19.99"),
            (0.000004, "0.000004"),
            (0.000001, "0.000001"),
            (123_456_789.123_456, "123456789.123456"),
            (999_999_999.999_999, "999999999.999999"),
        ] {
            assert_eq!(canonical_json(&number(double)), text);
            assert_eq!(formatted(double), text);
        }
        // Every decimal of up to four significant digits and one to seven places, both signs.
        for digits in 1..10_000u32 {
            for places in 1..=7 {
                let double = f64::from(digits) / 10f64.powi(places);
                for double in [double, -double] {
                    assert_eq!(
                        canonical_json(&number(double)),
                        formatted(double),
                        "{double:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_object_found_out_of_utf16_order_midway_is_written_again_sorted() {
        // Members already written (with a nested object of their own) before the first name
        // that sorts differently in UTF-16; the buffer walk takes them back, the writer walk
        // never wrote them in that order.
        let value = json!({
            "outer": [{ "a": { "z": 1, "y": [2] }, "b": 3, "\u{e000}": 4, "\u{1f600}": 5 }],
            "tail": { "\u{1f600}": null },
        });
        let expected = "{\"outer\":[{\"a\":{\"y\":[2],\"z\":1},\"b\":3,\"\u{1f600}\":5,\"\u{e000}\":4}],\"tail\":{\"\u{1f600}\":null}}";
        assert_eq!(canonical_json(&value), expected);
        let mut written = Vec::new();
        super::to_writer(&value, &mut written).expect("a Vec takes every byte");
        assert_eq!(String::from_utf8(written).expect("UTF-8"), expected);
    }

    /// A writer that fails after taking `room` bytes.
    struct Full {
        room: usize,
        taken: Vec<u8>,
    }

    impl std::io::Write for Full {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"));
            }
            let n = bytes.len().min(self.room);
            self.taken.extend_from_slice(&bytes[..n]);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_writer_s_first_error_is_returned_and_nothing_follows_it() {
        let value = json!({ "b": [1, 2, 3], "a": "text" });
        let mut full = Full {
            room: 7,
            taken: Vec::new(),
        };
        let err = super::to_writer(&value, &mut full).expect_err("no room left");
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(
            full.taken, br#"{"a":"t"#,
            "the bytes before the error, nothing after"
        );
    }

    /// Bytes around the ones that need an escape, and those themselves.
    fn escape_edge_byte() -> impl Strategy<Value = u8> {
        prop_oneof![
            prop::sample::select(vec![
                0x00u8, 0x01, 0x08, 0x1f, 0x20, 0x21, b'"', 0x23, b'[', b'\\', b']', 0x7f, 0x80,
                0x9f, 0xa2, 0xdc, 0xff, b'a',
            ]),
            any::<u8>(),
        ]
    }

    proptest! {
        /// The word-at-a-time test agrees with the escape table on every byte of the word.
        #[test]
        fn a_word_needs_an_escape_exactly_when_one_of_its_bytes_does(
            word in prop_oneof![
                any::<u64>(),
                prop::array::uniform8(escape_edge_byte()).prop_map(u64::from_le_bytes),
            ]
        ) {
            let expected = word
                .to_le_bytes()
                .iter()
                .any(|&byte| super::ESCAPES[usize::from(byte)] != 0);
            prop_assert_eq!(super::word_needs_escape(word), expected);
        }

        /// The word-at-a-time scan finds the byte a byte-at-a-time scan finds.
        #[test]
        fn the_scan_for_an_escape_finds_the_first_byte_that_needs_one(
            bytes in prop::collection::vec(escape_edge_byte(), 0..40),
            from in 0usize..40,
        ) {
            let from = from.min(bytes.len());
            let expected = (from..bytes.len()).find(|&at| {
                matches!(bytes[at], 0x00..=0x1f | b'"' | b'\\')
            });
            prop_assert_eq!(super::next_escape(&bytes, from), expected);
        }

        #[test]
        fn output_reparses_to_the_input_and_is_a_fixed_point(value in arbitrary_json()) {
            let text = canonical_json(&value);
            let reparsed: Value = serde_json::from_str(&text)
                .map_err(|error| TestCaseError::fail(format!("{error}: {text}")))?;
            prop_assert_eq!(normalize_numbers(&reparsed), normalize_numbers(&value));
            prop_assert_eq!(canonical_json(&reparsed), text);
        }

        /// Whatever the map's order and names, the members come out in UTF-16 order (the
        /// walk keeps the map's own order only when it is that order), and the writer and the
        /// string agree byte for byte.
        #[test]
        fn the_writer_the_length_and_the_string_agree_with_a_sorting_reference(
            value in arbitrary_json()
        ) {
            let text = canonical_json(&value);
            prop_assert_eq!(&text, &reference(&value));
            let mut written = Vec::new();
            super::to_writer(&value, &mut written).expect("a Vec takes every byte");
            prop_assert_eq!(written, text.as_bytes());
        }

        #[test]
        fn every_double_prints_as_the_float_formatter_prints_it(
            double in prop_oneof![
                any::<f64>(),
                (0u64..1_000_000_000_000_000, 0i32..=8)
                    .prop_map(|(digits, places)| digits as f64 / 10f64.powi(places)),
            ]
        ) {
            prop_assume!(double.is_finite());
            prop_assert_eq!(canonical_json(&number(double)), formatted(double));
        }

        #[test]
        fn numbers_round_trip_through_an_exact_parser(bits in any::<u64>()) {
            let double = f64::from_bits(bits);
            prop_assume!(double.is_finite());
            let text = canonical_json(&Value::from(double));
            prop_assert_eq!(text.parse::<f64>().ok(), Some(double));
            prop_assert!(!text.contains('E'), "exponent marker is lowercase: {}", text);
        }
    }
}
