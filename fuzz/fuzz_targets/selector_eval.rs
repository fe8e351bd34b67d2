//! Structured input: a selector written from the grammar (as a syntax tree, so it parses often, or
//! as a list of grammar tokens, so it also reaches the parser's error paths) and a message with
//! arbitrary typed properties and headers. A selector that parses must obey the laws in
//! `ferry_fuzz::check_laws` against that message.

#![no_main]

use std::fmt::Write;

use arbitrary::Arbitrary;
use ferry_fuzz::{check_laws, message};
use ferry_kernel::{Priority, PropertyValue, Selector, SelectorLimits};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    selector: Text,
    properties: Vec<(Name, Value)>,
    priority: u8,
    correlation_id: Option<Str>,
    jms_type: Option<Str>,
    group_id: Option<Str>,
    persistent: bool,
    timestamp_ms: u64,
    delivery_count: u32,
}

/// The selector's text. Leaves come first in every enum: when the input runs out, `arbitrary`
/// picks the first variant, so generation always ends.
#[derive(Debug, Arbitrary)]
enum Text {
    Tree(Cond),
    Tokens(Vec<Token>),
}

/// Property names a selector and a message both draw from, so they meet often.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Name {
    A,
    B,
    Color,
    N,
    Dollar,
    Unicode,
    /// Not a header: names are case-sensitive, and only `JMS...` is reserved.
    LowerJms,
}

impl Name {
    fn as_str(self) -> &'static str {
        match self {
            Name::A => "a",
            Name::B => "b",
            Name::Color => "color",
            Name::N => "n",
            Name::Dollar => "$x_1",
            Name::Unicode => "größe",
            Name::LowerJms => "jmsPriority",
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Header {
    DeliveryMode,
    Priority,
    MessageId,
    Timestamp,
    CorrelationId,
    Type,
    DeliveryCount,
    GroupId,
    /// Reserved but not a header: always refused.
    Unknown,
}

impl Header {
    fn as_str(self) -> &'static str {
        match self {
            Header::DeliveryMode => "JMSDeliveryMode",
            Header::Priority => "JMSPriority",
            Header::MessageId => "JMSMessageID",
            Header::Timestamp => "JMSTimestamp",
            Header::CorrelationId => "JMSCorrelationID",
            Header::Type => "JMSType",
            Header::DeliveryCount => "JMSXDeliveryCount",
            Header::GroupId => "JMSXGroupID",
            Header::Unknown => "JMSExpiration",
        }
    }
}

/// String contents: a few that matter to LIKE, equality and quoting, or anything.
#[derive(Debug, Clone, Arbitrary)]
enum Str {
    Empty,
    Red,
    Percent,
    Underscore,
    Quote,
    Backslash,
    Unicode,
    PersistentMode,
    Digits,
    Any(String),
}

impl Str {
    fn as_str(&self) -> &str {
        match self {
            Str::Empty => "",
            Str::Red => "red",
            Str::Percent => "a%",
            Str::Underscore => "_b",
            Str::Quote => "it's",
            Str::Backslash => "x\\_%",
            Str::Unicode => "ü€𝄞",
            Str::PersistentMode => "PERSISTENT",
            Str::Digits => "3",
            Str::Any(s) => s,
        }
    }
}

/// Writes `s` as a selector string literal.
fn quoted(out: &mut String, s: &str) {
    out.push('\'');
    out.push_str(&s.replace('\'', "''"));
    out.push('\'');
}

/// A finite double as selector text (the lexer has no NaN or infinity); the sign is a token.
fn double(out: &mut String, v: f64) {
    let v = if v.is_finite() { v } else { 1.5 };
    if v.is_sign_negative() {
        out.push('-');
    }
    // `{:?}` always has a '.' or an exponent, so it lexes as an approximate number.
    let _ = write!(out, "{:?}", v.abs());
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl ArithOp {
    fn as_str(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
        }
    }
}

/// A field IN and LIKE accept: a property or a string header.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum StrField {
    Property(Name),
    CorrelationId,
    Type,
    GroupId,
    MessageId,
    DeliveryMode,
}

impl StrField {
    fn as_str(self) -> &'static str {
        match self {
            StrField::Property(n) => n.as_str(),
            StrField::CorrelationId => "JMSCorrelationID",
            StrField::Type => "JMSType",
            StrField::GroupId => "JMSXGroupID",
            StrField::MessageId => "JMSMessageID",
            StrField::DeliveryMode => "JMSDeliveryMode",
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Field {
    Property(Name),
    Header(Header),
}

impl Field {
    fn as_str(self) -> &'static str {
        match self {
            Field::Property(n) => n.as_str(),
            Field::Header(h) => h.as_str(),
        }
    }
}

/// A value; arithmetic is written without parentheses unless `Paren` asks for them, so the
/// parser's precedence decides how it groups.
#[derive(Debug, Arbitrary)]
enum Operand {
    Field(Field),
    Int(i64),
    Small(i8),
    Hex(u64),
    Double(f64),
    Str(Str),
    Bool(bool),
    Sign(bool, Box<Operand>),
    Arith(Box<Operand>, ArithOp, Box<Operand>),
    Paren(Box<Operand>),
}

impl Operand {
    fn write(&self, out: &mut String) {
        match self {
            Operand::Field(f) => out.push_str(f.as_str()),
            Operand::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Operand::Small(v) => {
                let _ = write!(out, "{v}");
            }
            Operand::Hex(v) => {
                let _ = write!(out, "0x{v:X}");
            }
            Operand::Double(v) => double(out, *v),
            Operand::Str(s) => quoted(out, s.as_str()),
            Operand::Bool(b) => out.push_str(if *b { "TRUE" } else { "FALSE" }),
            Operand::Sign(negate, o) => {
                out.push_str(if *negate { "-" } else { "+" });
                o.write(out);
            }
            Operand::Arith(l, op, r) => {
                l.write(out);
                let _ = write!(out, " {} ", op.as_str());
                r.write(out);
            }
            Operand::Paren(o) => {
                out.push('(');
                o.write(out);
                out.push(')');
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Cond {
    Bool(bool),
    Property(Name),
    Compare(Operand, CmpOp, Operand),
    Between {
        negated: bool,
        value: Operand,
        low: Operand,
        high: Operand,
    },
    In {
        negated: bool,
        field: StrField,
        first: Str,
        rest: Vec<Str>,
    },
    Like {
        negated: bool,
        field: StrField,
        pattern: Str,
        escape: Option<char>,
    },
    IsNull {
        negated: bool,
        field: Field,
    },
    Not(Box<Cond>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
    Paren(Box<Cond>),
}

fn not(out: &mut String, negated: bool) {
    if negated {
        out.push_str(" NOT");
    }
}

impl Cond {
    fn write(&self, out: &mut String) {
        match self {
            Cond::Bool(b) => out.push_str(if *b { "TRUE" } else { "FALSE" }),
            Cond::Property(n) => out.push_str(n.as_str()),
            Cond::Compare(l, op, r) => {
                l.write(out);
                let _ = write!(out, " {} ", op.as_str());
                r.write(out);
            }
            Cond::Between {
                negated,
                value,
                low,
                high,
            } => {
                value.write(out);
                not(out, *negated);
                out.push_str(" BETWEEN ");
                low.write(out);
                out.push_str(" AND ");
                high.write(out);
            }
            Cond::In {
                negated,
                field,
                first,
                rest,
            } => {
                out.push_str(field.as_str());
                not(out, *negated);
                out.push_str(" IN (");
                quoted(out, first.as_str());
                for s in rest {
                    out.push_str(", ");
                    quoted(out, s.as_str());
                }
                out.push(')');
            }
            Cond::Like {
                negated,
                field,
                pattern,
                escape,
            } => {
                out.push_str(field.as_str());
                not(out, *negated);
                out.push_str(" LIKE ");
                quoted(out, pattern.as_str());
                if let Some(c) = escape {
                    out.push_str(" ESCAPE ");
                    quoted(out, c.encode_utf8(&mut [0; 4]));
                }
            }
            Cond::IsNull { negated, field } => {
                out.push_str(field.as_str());
                out.push_str(" IS");
                not(out, *negated);
                out.push_str(" NULL");
            }
            Cond::Not(c) => {
                out.push_str("NOT ");
                c.write(out);
            }
            Cond::And(l, r) => {
                l.write(out);
                out.push_str(" AND ");
                r.write(out);
            }
            Cond::Or(l, r) => {
                l.write(out);
                out.push_str(" OR ");
                r.write(out);
            }
            Cond::Paren(c) => {
                out.push('(');
                c.write(out);
                out.push(')');
            }
        }
    }
}

/// One token of the selector grammar, or a near miss the lexer must refuse.
#[derive(Debug, Arbitrary)]
enum Token {
    Name(Name),
    Header(Header),
    Int(u64),
    Double(f64),
    Str(Str),
    Not,
    And,
    Or,
    Between,
    In,
    Like,
    Escape,
    Is,
    Null,
    True,
    False,
    LParen,
    RParen,
    Comma,
    Cmp(CmpOp),
    Arith(ArithOp),
    /// `!=`, an unterminated string, `"`, `0x` without digits, an exponent without digits,
    /// a letter glued to a number, `.5`, `7.`, a lower-case keyword.
    NearMiss(u8),
}

impl Token {
    fn write(&self, out: &mut String) {
        let text = match self {
            Token::Name(n) => n.as_str(),
            Token::Header(h) => h.as_str(),
            Token::Int(v) => {
                let _ = write!(out, "{v}");
                return;
            }
            Token::Double(v) => return double(out, *v),
            Token::Str(s) => return quoted(out, s.as_str()),
            Token::Not => "NOT",
            Token::And => "AND",
            Token::Or => "OR",
            Token::Between => "BETWEEN",
            Token::In => "IN",
            Token::Like => "LIKE",
            Token::Escape => "ESCAPE",
            Token::Is => "IS",
            Token::Null => "NULL",
            Token::True => "TRUE",
            Token::False => "FALSE",
            Token::LParen => "(",
            Token::RParen => ")",
            Token::Comma => ",",
            Token::Cmp(op) => op.as_str(),
            Token::Arith(op) => op.as_str(),
            Token::NearMiss(i) => {
                const NEAR_MISSES: [&str; 10] = [
                    "!=",
                    "'open",
                    "\"s\"",
                    "0x",
                    "1e",
                    "57L",
                    ".5",
                    "7.",
                    "and",
                    "9223372036854775808",
                ];
                NEAR_MISSES[usize::from(*i) % NEAR_MISSES.len()]
            }
        };
        out.push_str(text);
    }
}

impl Text {
    fn render(&self) -> String {
        let mut out = String::new();
        match self {
            Text::Tree(c) => c.write(&mut out),
            Text::Tokens(tokens) => {
                for (i, t) in tokens.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    t.write(&mut out);
                }
            }
        }
        out
    }
}

fn property(v: &Value) -> PropertyValue {
    match v {
        Value::Bool(b) => PropertyValue::Bool(*b),
        Value::Int(v) => PropertyValue::Int(*v),
        Value::SmallInt(v) => PropertyValue::Int(i32::from(*v)),
        Value::Long(v) => PropertyValue::Long(*v),
        Value::Double(v) => PropertyValue::Double(*v),
        Value::String(s) => PropertyValue::String(s.as_str().to_owned()),
    }
}

/// A property value: every type, and every double (NaN, infinities, -0.0) included.
#[derive(Debug, Arbitrary)]
enum Value {
    Bool(bool),
    Int(i32),
    SmallInt(i8),
    Long(i64),
    Double(f64),
    String(Str),
}

fuzz_target!(|input: Input| {
    let text = input.selector.render();
    let limits = SelectorLimits::default();
    let Ok(selector) = Selector::parse(&text, &limits) else {
        return;
    };
    let mut m = message(
        input
            .properties
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), property(v)))
            .collect(),
    );
    m.priority = Priority::new(u32::from(input.priority % 10)).expect("0-9 is a priority");
    m.correlation_id = input.correlation_id.as_ref().map(|s| s.as_str().to_owned());
    m.jms_type = input.jms_type.as_ref().map(|s| s.as_str().to_owned());
    m.group_id = input.group_id.as_ref().map(|s| s.as_str().to_owned());
    m.persistent = input.persistent;
    m.timestamp_ms = input.timestamp_ms;
    check_laws(&selector, &limits, &m, input.delivery_count);
});
