//! The comparisons of the grammar: `= <> < <= > >=`, `[NOT] BETWEEN`, `[NOT] IN`, `[NOT] LIKE`
//! and `IS [NOT] NULL`, with their static type checks.

use super::lexer::{Keyword, Tok};
use super::like::LikePattern;
use super::parser::{Kind, Parsed, Parser, Result};
use super::{invalid, CmpOp, Expr, Field};

impl Parser<'_> {
    /// `left op right` with `op` one of `= <> < <= > >=`; `<` and the like on strings or
    /// booleans, and comparisons between known different types, are refused here.
    pub(super) fn compare(&mut self, left: Parsed, op: CmpOp, op_pos: usize) -> Result<Parsed> {
        let symbol = self.bump();
        let right = self.additive()?;
        let ordering = !matches!(op, CmpOp::Eq | CmpOp::Ne);
        for side in [&left, &right] {
            if ordering && matches!(side.kind, Kind::Str | Kind::Bool) {
                return Err(invalid(
                    side.pos,
                    format!(
                        "{symbol} compares numbers, but this is {}; strings and booleans \
                         support only = and <>",
                        side.kind.described()
                    ),
                ));
            }
        }
        let known = |k: Kind| k != Kind::Property;
        if known(left.kind) && known(right.kind) && left.kind != right.kind {
            return Err(invalid(
                right.pos,
                format!(
                    "{} on the left of {symbol} cannot be compared with {} on the right",
                    left.kind.described(),
                    right.kind.described()
                ),
            ));
        }
        let depth = left.depth.max(right.depth) + 1;
        let expr = Expr::Compare {
            op,
            left: Box::new(left.expr),
            right: Box::new(right.expr),
        };
        self.node(op_pos, expr, Kind::Bool, depth)
    }

    /// `value [NOT] BETWEEN low AND high`, on numbers.
    pub(super) fn between(&mut self, value: Parsed, negated: bool) -> Result<Parsed> {
        let pos = self.pos();
        self.bump();
        let low = self.additive()?;
        if !self.eat(Keyword::And) {
            return Err(invalid(
                self.pos(),
                format!(
                    "expected AND in BETWEEN low AND high {}, found {}",
                    self.previous(),
                    self.found()
                ),
            ));
        }
        let high = self.additive()?;
        for side in [&value, &low, &high] {
            if matches!(side.kind, Kind::Str | Kind::Bool) {
                return Err(invalid(
                    side.pos,
                    format!(
                        "BETWEEN compares numbers, but this is {}",
                        side.kind.described()
                    ),
                ));
            }
        }
        let depth = value.depth.max(low.depth).max(high.depth) + 1;
        let expr = Expr::Between {
            negated,
            value: Box::new(value.expr),
            low: Box::new(low.expr),
            high: Box::new(high.expr),
        };
        self.node(pos, expr, Kind::Bool, depth)
    }

    /// `name [NOT] IN ('a', 'b', ...)`: string literals only.
    pub(super) fn in_list(&mut self, left: Parsed, negated: bool) -> Result<Parsed> {
        let pos = self.pos();
        self.bump();
        let field = string_field(left, "IN")?;
        if self.peek() != &Tok::LParen {
            return Err(invalid(
                self.pos(),
                format!(
                    "expected '(' after IN, found {}; write country IN ('UK', 'FR')",
                    self.found()
                ),
            ));
        }
        self.bump();
        let list = self.in_items()?;
        let expr = Expr::In {
            negated,
            field,
            list,
        };
        self.node(pos, expr, Kind::Bool, 2)
    }

    /// The strings of an IN list, after its '(' and through its ')'.
    fn in_items(&mut self) -> Result<Vec<String>> {
        if self.peek() == &Tok::RParen {
            return Err(invalid(
                self.pos(),
                "the IN list is empty; list at least one string",
            ));
        }
        let mut list = Vec::new();
        loop {
            let item_pos = self.pos();
            let Tok::Str(item) = self.peek().clone() else {
                return Err(invalid(
                    item_pos,
                    format!(
                        "an IN list holds only string literals, found {}; quote it, as in ('1')",
                        self.found()
                    ),
                ));
            };
            if list.len() == self.limits.in_list_max {
                return Err(invalid(
                    item_pos,
                    format!(
                        "the IN list has more than {} entries (in_list_max); split it",
                        self.limits.in_list_max
                    ),
                ));
            }
            self.count_node(item_pos)?;
            self.bump();
            list.push(item);
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RParen => {
                    self.bump();
                    return Ok(list);
                }
                other => {
                    return Err(invalid(
                        self.pos(),
                        format!("expected ',' or ')' in the IN list, found {other}"),
                    ))
                }
            }
        }
    }

    /// `name [NOT] LIKE 'pattern' [ESCAPE 'c']`.
    pub(super) fn like(&mut self, left: Parsed, negated: bool) -> Result<Parsed> {
        let pos = self.pos();
        self.bump();
        let field = string_field(left, "LIKE")?;
        let pattern_pos = self.pos();
        let Tok::Str(pattern) = self.bump() else {
            return Err(invalid(
                pattern_pos,
                "LIKE needs a pattern in single quotes, like 'ab%'",
            ));
        };
        let pattern_chars = pattern.chars().count();
        if pattern_chars > self.limits.like_pattern_chars_max {
            return Err(invalid(
                pattern_pos,
                format!(
                    "the LIKE pattern is {pattern_chars} characters, the limit is {} \
                     (like_pattern_chars_max)",
                    self.limits.like_pattern_chars_max
                ),
            ));
        }
        let mut escape = None;
        if self.eat(Keyword::Escape) {
            let escape_pos = self.pos();
            let Tok::Str(text) = self.bump() else {
                return Err(invalid(
                    escape_pos,
                    "ESCAPE needs one character in single quotes, like ESCAPE '\\'",
                ));
            };
            let mut chars = text.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => escape = Some(c),
                _ => {
                    return Err(invalid(
                        escape_pos,
                        format!(
                            "ESCAPE needs exactly one character, found {}",
                            text.chars().count()
                        ),
                    ))
                }
            }
        }
        let pattern = LikePattern::compile(&pattern, escape)
            .map_err(|reason| invalid(pattern_pos, reason))?;
        let expr = Expr::Like {
            negated,
            field,
            pattern,
        };
        self.node(pos, expr, Kind::Bool, 2)
    }

    /// `name IS [NOT] NULL`.
    pub(super) fn is_null(&mut self, left: Parsed) -> Result<Parsed> {
        let pos = self.pos();
        self.bump();
        let negated = self.eat(Keyword::Not);
        if !self.eat(Keyword::Null) {
            return Err(invalid(
                self.pos(),
                format!("expected NULL {}, found {}", self.previous(), self.found()),
            ));
        }
        let Expr::Field(field) = left.expr else {
            return Err(invalid(
                left.pos,
                "IS NULL tests a property or header name, as in color IS NULL",
            ));
        };
        self.node(pos, Expr::IsNull { negated, field }, Kind::Bool, 2)
    }
}

/// The left side of IN or LIKE: a property, or a header whose value is a string.
fn string_field(left: Parsed, operator: &str) -> Result<Field> {
    match (left.expr, left.kind) {
        (Expr::Field(field), Kind::Str | Kind::Property) => Ok(field),
        (Expr::Field(_), _) => Err(invalid(
            left.pos,
            format!("{operator} tests strings, but this header is a number"),
        )),
        _ => Err(invalid(
            left.pos,
            format!("{operator} tests a property or header name, as in color {operator} ..."),
        )),
    }
}
