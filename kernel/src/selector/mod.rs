//! JMS message selectors (JMS 2.0 §3.8.1): an SQL-92 conditional expression over a message's
//! headers and properties, parsed once and evaluated against every candidate message.
//!
//! Parsing rejects everything it can know is wrong — bad syntax, reserved `JMS` names, type errors
//! between literals and headers, and any selector over a [`SelectorLimits`] bound — with
//! [`KernelError::InvalidSelector`] naming the 1-based character position and what to change.
//! Evaluation never fails and never panics: whatever cannot be decided (a missing property, a
//! string compared with a number, an overflow) is SQL's UNKNOWN, and only TRUE matches.
//!
//! Evaluation choices where the specification is silent:
//! - exact arithmetic is 64-bit and checked: overflow, and division by zero (exact or
//!   approximate), give NULL; approximate arithmetic otherwise follows IEEE 754;
//! - an exact and an approximate number are compared exactly (no rounding of large longs), and a
//!   comparison with NaN is UNKNOWN;
//! - strings and booleans support only `=` and `<>` (byte-for-byte, case-sensitive); `<` and the
//!   like on them are UNKNOWN, or a parse error when the types are known from the text;
//! - a string property is never converted to a number.

mod eval;
mod lexer;
mod like;
mod parser;
mod predicate;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod predicate_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use crate::error::KernelError;
use crate::types::Message;

use like::LikePattern;

/// Bounds on the cost of any selector: parsing rejects a selector over any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectorLimits {
    /// Length of the selector text, in characters.
    pub length_chars_max: usize,
    /// Nesting of parentheses, `NOT`, signs and operators. Bounds the stack used to parse,
    /// evaluate and drop a selector.
    pub depth_max: usize,
    /// Values, names and operators in the parsed selector, IN-list entries included.
    pub nodes_max: usize,
    /// Entries in one `IN (...)` list.
    pub in_list_max: usize,
    /// Length of one `LIKE` pattern, in characters.
    pub like_pattern_chars_max: usize,
}

impl Default for SelectorLimits {
    fn default() -> Self {
        Self {
            length_chars_max: 4096,
            depth_max: 64,
            nodes_max: 1000,
            in_list_max: 256,
            like_pattern_chars_max: 256,
        }
    }
}

/// A parsed message selector.
#[derive(Debug, Clone)]
pub struct Selector {
    text: String,
    root: Expr,
}

impl Selector {
    /// Parses `text`, checking it against `limits`. An empty selector is an error: the caller
    /// decides whether "no selector" means "every message".
    pub fn parse(text: &str, limits: &SelectorLimits) -> Result<Selector, KernelError> {
        let root = parser::parse(text, limits)?;
        Ok(Selector {
            text: text.to_owned(),
            root,
        })
    }

    /// True only when the selector evaluates to TRUE (FALSE and UNKNOWN do not match).
    /// `delivery_count` is the `JMSXDeliveryCount` this delivery would have.
    pub fn matches(&self, m: &Message, delivery_count: u32) -> bool {
        eval::matches(&self.root, m, delivery_count)
    }

    /// The selector as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The literal when the selector is `JMSCorrelationID = '<literal>'`, alone or as one of the
    /// operands of a top-level AND: only messages with that correlation id can match, so an
    /// index lookup may replace a scan.
    pub fn correlation_id_equals(&self) -> Option<&str> {
        self.header_equals(Header::CorrelationId)
    }

    /// Like [`Selector::correlation_id_equals`], for any header the store indexes
    /// (`JMSCorrelationID` first, then `JMSXGroupID`).
    pub fn indexed_equality(&self) -> Option<(IndexedHeader, &str)> {
        [
            (IndexedHeader::CorrelationId, Header::CorrelationId),
            (IndexedHeader::GroupId, Header::GroupId),
        ]
        .into_iter()
        .find_map(|(indexed, header)| self.header_equals(header).map(|v| (indexed, v)))
    }

    fn header_equals(&self, header: Header) -> Option<&str> {
        let conjuncts = match &self.root {
            Expr::And(items) => items.as_slice(),
            other => std::slice::from_ref(other),
        };
        conjuncts.iter().find_map(|e| match e {
            Expr::Compare {
                op: CmpOp::Eq,
                left,
                right,
            } => match (&**left, &**right) {
                (Expr::Field(Field::Header(h)), Expr::Str(s))
                | (Expr::Str(s), Expr::Field(Field::Header(h)))
                    if *h == header =>
                {
                    Some(s.as_str())
                }
                _ => None,
            },
            _ => None,
        })
    }
}

/// A message header the store keeps an index on, so a selector that asks for one value of it
/// finds its messages without a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexedHeader {
    /// `JMSCorrelationID` (request-reply).
    CorrelationId,
    /// `JMSXGroupID` (message groups).
    GroupId,
}

impl IndexedHeader {
    /// The header's value in a message, if it has one.
    pub fn value_of(self, m: &Message) -> Option<&str> {
        match self {
            IndexedHeader::CorrelationId => m.correlation_id.as_deref(),
            IndexedHeader::GroupId => m.group_id.as_deref(),
        }
    }
}

/// The parsed selector. Conditions (comparisons, AND, OR...) evaluate to a boolean or NULL
/// (UNKNOWN); arithmetic to a number or NULL.
#[derive(Debug, Clone)]
enum Expr {
    Bool(bool),
    Long(i64),
    Double(f64),
    Str(String),
    Field(Field),
    /// Unary `-` (`negate`) or `+`; `+` still turns a non-number into NULL.
    Sign {
        negate: bool,
        operand: Box<Expr>,
    },
    Arith {
        op: ArithOp,
        left: Box<Expr>,
        right: Box<Expr>,
    },
    Compare {
        op: CmpOp,
        left: Box<Expr>,
        right: Box<Expr>,
    },
    Between {
        negated: bool,
        value: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
    },
    In {
        negated: bool,
        field: Field,
        list: Vec<String>,
    },
    Like {
        negated: bool,
        field: Field,
        pattern: LikePattern,
    },
    IsNull {
        negated: bool,
        field: Field,
    },
    Not(Box<Expr>),
    /// Flattened: `a AND (b AND c)` is one node with three operands.
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// What an identifier names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Property(String),
    Header(Header),
}

/// The headers a selector may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    DeliveryMode,
    Priority,
    MessageId,
    Timestamp,
    CorrelationId,
    Type,
    DeliveryCount,
    GroupId,
}

impl Header {
    /// Every header with its selector name and whether its value is a number (else a string).
    const ALL: [(Header, &'static str, bool); 8] = [
        (Header::DeliveryMode, "JMSDeliveryMode", false),
        (Header::Priority, "JMSPriority", true),
        (Header::MessageId, "JMSMessageID", false),
        (Header::Timestamp, "JMSTimestamp", true),
        (Header::CorrelationId, "JMSCorrelationID", false),
        (Header::Type, "JMSType", false),
        (Header::DeliveryCount, "JMSXDeliveryCount", true),
        (Header::GroupId, "JMSXGroupID", false),
    ];
}

/// The error every selector problem becomes.
fn invalid(position: usize, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidSelector {
        position,
        reason: reason.into(),
    }
}
