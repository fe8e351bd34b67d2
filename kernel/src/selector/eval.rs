//! Evaluation with SQL's three-valued logic. A condition is TRUE, FALSE or UNKNOWN, written
//! `Some(true)`, `Some(false)` and `None`; a value that is missing or cannot be computed is NULL.
//! Nothing here fails or panics: whatever cannot be decided is NULL or UNKNOWN.

use std::cmp::Ordering;

use super::{ArithOp, CmpOp, Expr, Field, Header};
use crate::types::{Message, PropertyValue};

/// A value during evaluation. Exact numbers of every width are `Long`: int widens to long
/// losslessly, so one variant is enough.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value<'a> {
    Null,
    Bool(bool),
    Long(i64),
    Double(f64),
    Str(&'a str),
}

/// What a selector can read: the message and the delivery count it would be delivered with.
struct Input<'a> {
    message: &'a Message,
    delivery_count: u32,
}

pub(super) fn matches(root: &Expr, message: &Message, delivery_count: u32) -> bool {
    let input = Input {
        message,
        delivery_count,
    };
    truth(eval(root, &input)) == Some(true)
}

fn truth(v: Value<'_>) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(b),
        _ => None,
    }
}

fn from_truth<'a>(t: Option<bool>) -> Value<'a> {
    t.map_or(Value::Null, Value::Bool)
}

/// Recursion is bounded by the tree's depth, which the parser limits to `depth_max`.
fn eval<'a>(expr: &'a Expr, input: &Input<'a>) -> Value<'a> {
    match expr {
        Expr::Bool(b) => Value::Bool(*b),
        Expr::Long(v) => Value::Long(*v),
        Expr::Double(v) => Value::Double(*v),
        Expr::Str(s) => Value::Str(s),
        Expr::Field(field) => read(field, input),
        Expr::Sign { negate, operand } => sign(*negate, eval(operand, input)),
        Expr::Arith { op, left, right } => arith(*op, eval(left, input), eval(right, input)),
        Expr::Compare { op, left, right } => {
            from_truth(compare(*op, eval(left, input), eval(right, input)))
        }
        Expr::Between {
            negated,
            value,
            low,
            high,
        } => {
            let v = eval(value, input);
            let above_low = compare(CmpOp::Ge, v, eval(low, input));
            let below_high = compare(CmpOp::Le, v, eval(high, input));
            from_truth(and(above_low, below_high).map(|t| t != *negated))
        }
        Expr::In {
            negated,
            field,
            list,
        } => match read(field, input) {
            Value::Str(s) => Value::Bool(list.iter().any(|item| item == s) != *negated),
            _ => Value::Null,
        },
        Expr::Like {
            negated,
            field,
            pattern,
        } => match read(field, input) {
            Value::Str(s) => Value::Bool(pattern.matches(s) != *negated),
            _ => Value::Null,
        },
        Expr::IsNull { negated, field } => {
            Value::Bool((read(field, input) == Value::Null) != *negated)
        }
        Expr::Not(operand) => from_truth(truth(eval(operand, input)).map(|t| !t)),
        Expr::And(operands) => {
            let mut result = Some(true);
            for operand in operands {
                result = and(result, truth(eval(operand, input)));
                if result == Some(false) {
                    break;
                }
            }
            from_truth(result)
        }
        Expr::Or(operands) => {
            let mut result = Some(false);
            for operand in operands {
                result = or(result, truth(eval(operand, input)));
                if result == Some(true) {
                    break;
                }
            }
            from_truth(result)
        }
    }
}

/// FALSE wins over UNKNOWN.
fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// TRUE wins over UNKNOWN.
fn or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn read<'a>(field: &'a Field, input: &Input<'a>) -> Value<'a> {
    let m = input.message;
    let text = |s: &'a Option<String>| s.as_deref().map_or(Value::Null, Value::Str);
    match field {
        Field::Property(name) => match m.properties.get(name) {
            None => Value::Null,
            Some(PropertyValue::Bool(b)) => Value::Bool(*b),
            Some(PropertyValue::Int(v)) => Value::Long(i64::from(*v)),
            Some(PropertyValue::Long(v)) => Value::Long(*v),
            Some(PropertyValue::Double(v)) => Value::Double(*v),
            Some(PropertyValue::String(s)) => Value::Str(s),
        },
        Field::Header(header) => match header {
            Header::DeliveryMode if m.persistent => Value::Str("PERSISTENT"),
            Header::DeliveryMode => Value::Str("NON_PERSISTENT"),
            Header::Priority => Value::Long(i64::from(m.priority.get())),
            Header::MessageId => Value::Str(m.id.as_str()),
            // A timestamp past the range of a long cannot be compared truthfully.
            Header::Timestamp => i64::try_from(m.timestamp_ms).map_or(Value::Null, Value::Long),
            Header::CorrelationId => text(&m.correlation_id),
            Header::Type => text(&m.jms_type),
            Header::DeliveryCount => Value::Long(i64::from(input.delivery_count)),
            Header::GroupId => text(&m.group_id),
        },
    }
}

fn sign(negate: bool, v: Value<'_>) -> Value<'_> {
    match v {
        Value::Long(x) if negate => x.checked_neg().map_or(Value::Null, Value::Long),
        Value::Double(x) if negate => Value::Double(-x),
        Value::Long(_) | Value::Double(_) => v,
        Value::Null | Value::Bool(_) | Value::Str(_) => Value::Null,
    }
}

/// Exact arithmetic is checked: overflow and division by zero are NULL. Mixed exact and
/// approximate operands are computed as doubles; dividing a double by zero is NULL too.
fn arith<'a>(op: ArithOp, left: Value<'a>, right: Value<'a>) -> Value<'a> {
    if let (Value::Long(a), Value::Long(b)) = (left, right) {
        let result = match op {
            ArithOp::Add => a.checked_add(b),
            ArithOp::Sub => a.checked_sub(b),
            ArithOp::Mul => a.checked_mul(b),
            ArithOp::Div => a.checked_div(b),
        };
        return result.map_or(Value::Null, Value::Long);
    }
    let (Some(a), Some(b)) = (as_double(left), as_double(right)) else {
        return Value::Null;
    };
    Value::Double(match op {
        ArithOp::Add => a + b,
        ArithOp::Sub => a - b,
        ArithOp::Mul => a * b,
        ArithOp::Div if b == 0.0 => return Value::Null,
        ArithOp::Div => a / b,
    })
}

fn as_double(v: Value<'_>) -> Option<f64> {
    match v {
        // Promotion to double is what mixed arithmetic means; precision loss is expected.
        Value::Long(x) => Some(x as f64),
        Value::Double(x) => Some(x),
        Value::Null | Value::Bool(_) | Value::Str(_) => None,
    }
}

/// UNKNOWN when either side is NULL or the types do not compare (string with number, `<` on
/// strings or booleans, NaN).
fn compare(op: CmpOp, left: Value<'_>, right: Value<'_>) -> Option<bool> {
    let equality = |equal: bool| match op {
        CmpOp::Eq => Some(equal),
        CmpOp::Ne => Some(!equal),
        CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge => None,
    };
    let ordering = match (left, right) {
        (Value::Str(a), Value::Str(b)) => return equality(a == b),
        (Value::Bool(a), Value::Bool(b)) => return equality(a == b),
        (Value::Long(a), Value::Long(b)) => a.cmp(&b),
        (Value::Double(a), Value::Double(b)) => a.partial_cmp(&b)?,
        (Value::Long(a), Value::Double(b)) => compare_long_double(a, b)?,
        (Value::Double(a), Value::Long(b)) => compare_long_double(b, a)?.reverse(),
        _ => return None,
    };
    Some(match op {
        CmpOp::Eq => ordering == Ordering::Equal,
        CmpOp::Ne => ordering != Ordering::Equal,
        CmpOp::Lt => ordering == Ordering::Less,
        CmpOp::Le => ordering != Ordering::Greater,
        CmpOp::Gt => ordering == Ordering::Greater,
        CmpOp::Ge => ordering != Ordering::Less,
    })
}

/// Compares exactly, where converting the long to a double could round it (above 2^53) and make
/// distinct values equal. `None` for NaN.
fn compare_long_double(long: i64, double: f64) -> Option<Ordering> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    if double.is_nan() {
        return None;
    }
    if double >= TWO_POW_63 {
        return Some(Ordering::Less);
    }
    if double < -TWO_POW_63 {
        return Some(Ordering::Greater);
    }
    let whole = double.trunc();
    // In [-2^63, 2^63) and integral, so the cast is exact.
    let whole_long = whole as i64;
    Some(long.cmp(&whole_long).then_with(|| {
        // Equal whole parts: the double's fraction decides.
        0.0_f64
            .partial_cmp(&(double - whole))
            .unwrap_or(Ordering::Equal)
    }))
}
