//! Recursive descent over the tokens, one function per precedence level (lowest first): OR, AND,
//! NOT, comparison (its predicates are in `predicate.rs`), `+ -`, `* /`, unary sign, primary.
//! Each level checks static types where the text decides them (literals and headers) and every
//! [`SelectorLimits`] bound, and checks the nesting depth before it recurses, so no input can
//! exhaust the stack.

use super::lexer::{tokenize, Keyword, Tok, Token};
use super::{invalid, ArithOp, CmpOp, Expr, Field, Header, SelectorLimits};
use crate::error::KernelError;

pub(super) type Result<T> = std::result::Result<T, KernelError>;

/// What the text tells about a value's type. Properties are typed only at evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Bool,
    Number,
    Str,
    Property,
}

impl Kind {
    pub(super) fn described(self) -> &'static str {
        match self {
            Kind::Bool => "a condition",
            Kind::Number => "a number",
            Kind::Str => "a string",
            Kind::Property => "a property",
        }
    }
}

/// A parsed subexpression with what the parser needs to know about it.
#[derive(Debug)]
pub(super) struct Parsed {
    pub(super) expr: Expr,
    pub(super) kind: Kind,
    /// Height of the tree below and including this node.
    pub(super) depth: usize,
    /// Where the subexpression starts, for errors about it.
    pub(super) pos: usize,
}

pub(super) fn parse(text: &str, limits: &SelectorLimits) -> Result<Expr> {
    let length_chars = text.chars().count();
    if length_chars > limits.length_chars_max {
        return Err(invalid(
            limits.length_chars_max + 1,
            format!(
                "selector is {length_chars} characters, the limit is {} (length_chars_max); \
                 shorten it, for example with IN instead of many ORs",
                limits.length_chars_max
            ),
        ));
    }
    let mut parser = Parser {
        tokens: tokenize(text)?,
        at: 0,
        limits,
        nesting: 0,
        nodes: 0,
    };
    if parser.peek() == &Tok::End {
        return Err(invalid(
            1,
            "selector is empty; write a condition such as color = 'red'",
        ));
    }
    let root = parser.or_expr()?;
    parser.expect_end()?;
    require_condition(&root, "a selector")?;
    Ok(root.expr)
}

pub(super) struct Parser<'l> {
    tokens: Vec<Token>,
    at: usize,
    pub(super) limits: &'l SelectorLimits,
    /// Current recursion through parentheses, NOT and signs.
    nesting: usize,
    nodes: usize,
}

impl Parser<'_> {
    pub(super) fn peek(&self) -> &Tok {
        self.peek_at(0)
    }

    pub(super) fn peek_at(&self, ahead: usize) -> &Tok {
        // The last token is End, and nothing advances past it.
        self.tokens
            .get(self.at + ahead)
            .or(self.tokens.last())
            .map_or(&Tok::End, |t| &t.tok)
    }

    pub(super) fn pos(&self) -> usize {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(1, |t| t.pos)
    }

    pub(super) fn bump(&mut self) -> Tok {
        let tok = self.peek().clone();
        if tok != Tok::End {
            self.at += 1;
        }
        tok
    }

    pub(super) fn eat(&mut self, kw: Keyword) -> bool {
        let found = self.peek() == &Tok::Kw(kw);
        if found {
            self.bump();
        }
        found
    }

    /// How errors refer to what came just before the current token.
    pub(super) fn previous(&self) -> String {
        match self.at.checked_sub(1).and_then(|i| self.tokens.get(i)) {
            Some(t) => format!("after {}", t.tok),
            None => "at the start of the selector".to_owned(),
        }
    }

    pub(super) fn found(&self) -> String {
        self.peek().to_string()
    }

    /// Counts a new node and checks the node and depth limits.
    pub(super) fn node(
        &mut self,
        pos: usize,
        expr: Expr,
        kind: Kind,
        depth: usize,
    ) -> Result<Parsed> {
        self.count_node(pos)?;
        self.check_depth(pos, depth)?;
        Ok(Parsed {
            expr,
            kind,
            depth,
            pos,
        })
    }

    pub(super) fn count_node(&mut self, pos: usize) -> Result<()> {
        self.nodes += 1;
        if self.nodes > self.limits.nodes_max {
            return Err(invalid(
                pos,
                format!(
                    "selector has more than {} values, names and operators (nodes_max); \
                     simplify it",
                    self.limits.nodes_max
                ),
            ));
        }
        Ok(())
    }

    fn check_depth(&self, pos: usize, depth: usize) -> Result<()> {
        if depth > self.limits.depth_max {
            return Err(invalid(
                pos,
                format!(
                    "selector nests more than {} levels deep (depth_max); remove redundant \
                     parentheses or NOTs, or shorten chains of arithmetic",
                    self.limits.depth_max
                ),
            ));
        }
        Ok(())
    }

    /// Runs `f` one nesting level deeper, refusing to recurse past `depth_max`.
    fn nested<T>(&mut self, pos: usize, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.check_depth(pos, self.nesting + 1)?;
        self.nesting += 1;
        let result = f(self);
        self.nesting -= 1;
        result
    }

    fn expect_end(&self) -> Result<()> {
        match self.peek() {
            Tok::End => Ok(()),
            Tok::RParen => Err(invalid(self.pos(), "')' has no matching '('")),
            other => Err(invalid(
                self.pos(),
                format!(
                    "expected AND, OR or the end of the selector {}, found {other}",
                    self.previous()
                ),
            )),
        }
    }

    /// `a OR b OR c`, flattened into one node.
    fn or_expr(&mut self) -> Result<Parsed> {
        let first = self.and_expr()?;
        if self.peek() != &Tok::Kw(Keyword::Or) {
            return Ok(first);
        }
        let mut operands = vec![first];
        while self.eat(Keyword::Or) {
            operands.push(self.and_expr()?);
        }
        self.junction(operands, Keyword::Or)
    }

    fn and_expr(&mut self) -> Result<Parsed> {
        let first = self.not_expr()?;
        if self.peek() != &Tok::Kw(Keyword::And) {
            return Ok(first);
        }
        let mut operands = vec![first];
        while self.eat(Keyword::And) {
            operands.push(self.not_expr()?);
        }
        self.junction(operands, Keyword::And)
    }

    /// Builds an AND or OR node, absorbing operands that are the same junction, so that long
    /// chains and regrouping parentheses add no depth to evaluate.
    fn junction(&mut self, operands: Vec<Parsed>, kw: Keyword) -> Result<Parsed> {
        let and = kw == Keyword::And;
        let pos = operands.first().map_or(1, |p| p.pos);
        let mut depth = 1;
        let mut exprs = Vec::with_capacity(operands.len());
        for operand in operands {
            require_condition(&operand, &format!("each side of {}", kw.as_str()))?;
            match operand.expr {
                // The absorbed node's operands move up one level: no deeper than it was.
                Expr::And(inner) if and => {
                    depth = depth.max(operand.depth);
                    exprs.extend(inner);
                }
                Expr::Or(inner) if !and => {
                    depth = depth.max(operand.depth);
                    exprs.extend(inner);
                }
                expr => {
                    depth = depth.max(operand.depth + 1);
                    exprs.push(expr);
                }
            }
        }
        let expr = if and {
            Expr::And(exprs)
        } else {
            Expr::Or(exprs)
        };
        self.node(pos, expr, Kind::Bool, depth)
    }

    fn not_expr(&mut self) -> Result<Parsed> {
        let pos = self.pos();
        if !self.eat(Keyword::Not) {
            return self.comparison();
        }
        let operand = self.nested(pos, Self::not_expr)?;
        require_condition(&operand, "NOT's operand")?;
        let depth = operand.depth + 1;
        self.node(pos, Expr::Not(Box::new(operand.expr)), Kind::Bool, depth)
    }

    /// A value, optionally followed by one comparison; comparisons do not chain.
    fn comparison(&mut self) -> Result<Parsed> {
        let left = self.additive()?;
        let op_pos = self.pos();
        let negated = self.peek() == &Tok::Kw(Keyword::Not)
            && matches!(
                self.peek_at(1),
                Tok::Kw(Keyword::Between | Keyword::In | Keyword::Like)
            );
        if negated {
            self.bump();
        }
        let parsed = match self.peek().clone() {
            Tok::Kw(Keyword::Between) => self.between(left, negated)?,
            Tok::Kw(Keyword::In) => self.in_list(left, negated)?,
            Tok::Kw(Keyword::Like) => self.like(left, negated)?,
            Tok::Kw(Keyword::Is) => self.is_null(left)?,
            tok => match cmp_op(&tok) {
                Some(op) => self.compare(left, op, op_pos)?,
                None => return Ok(left),
            },
        };
        if cmp_op(self.peek()).is_some()
            || matches!(
                self.peek(),
                Tok::Kw(Keyword::Between | Keyword::In | Keyword::Like | Keyword::Is)
            )
        {
            return Err(invalid(
                self.pos(),
                format!(
                    "comparisons do not chain: found {} after a complete comparison; \
                     join comparisons with AND or OR",
                    self.found()
                ),
            ));
        }
        Ok(parsed)
    }

    pub(super) fn additive(&mut self) -> Result<Parsed> {
        let mut left = self.multiplicative()?;
        loop {
            let op = match self.peek() {
                Tok::Plus => ArithOp::Add,
                Tok::Minus => ArithOp::Sub,
                _ => return Ok(left),
            };
            let op_pos = self.pos();
            self.bump();
            let right = self.multiplicative()?;
            left = self.arith(op, op_pos, left, right)?;
        }
    }

    fn multiplicative(&mut self) -> Result<Parsed> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Tok::Star => ArithOp::Mul,
                Tok::Slash => ArithOp::Div,
                _ => return Ok(left),
            };
            let op_pos = self.pos();
            self.bump();
            let right = self.unary()?;
            left = self.arith(op, op_pos, left, right)?;
        }
    }

    fn arith(&mut self, op: ArithOp, op_pos: usize, left: Parsed, right: Parsed) -> Result<Parsed> {
        require_number(&left, op_pos)?;
        require_number(&right, op_pos)?;
        let depth = left.depth.max(right.depth) + 1;
        let pos = left.pos;
        let expr = Expr::Arith {
            op,
            left: Box::new(left.expr),
            right: Box::new(right.expr),
        };
        self.node(pos, expr, Kind::Number, depth)
    }

    /// `-x`, `+x`. A sign on a literal is folded into it, which is how -9223372036854775808
    /// (whose digits alone do not fit a long) is written.
    fn unary(&mut self) -> Result<Parsed> {
        let pos = self.pos();
        let negate = match self.peek() {
            Tok::Minus => true,
            Tok::Plus => false,
            _ => return self.primary(),
        };
        self.bump();
        if negate && self.peek() == &Tok::Integer(1 << 63) {
            self.bump();
            return self.node(pos, Expr::Long(i64::MIN), Kind::Number, 1);
        }
        let mut operand = self.nested(pos, Self::unary)?;
        require_number(&operand, pos)?;
        let folded = match operand.expr {
            Expr::Long(v) if negate => Expr::Long(
                v.checked_neg()
                    .ok_or_else(|| invalid(pos, "the number is outside the range of a long"))?,
            ),
            Expr::Double(v) if negate => Expr::Double(-v),
            Expr::Long(v) => Expr::Long(v),
            Expr::Double(v) => Expr::Double(v),
            expr => {
                let depth = operand.depth + 1;
                let sign = Expr::Sign {
                    negate,
                    operand: Box::new(expr),
                };
                return self.node(pos, sign, Kind::Number, depth);
            }
        };
        operand.expr = folded;
        operand.pos = pos;
        Ok(operand)
    }

    fn primary(&mut self) -> Result<Parsed> {
        let pos = self.pos();
        let (expr, kind) = match self.peek().clone() {
            Tok::Str(s) => (Expr::Str(s), Kind::Str),
            Tok::Integer(v) => match i64::try_from(v) {
                Ok(v) => (Expr::Long(v), Kind::Number),
                Err(_) => {
                    return Err(invalid(
                        pos,
                        format!(
                            "the number {v} is outside the range of a long \
                             (at most 9223372036854775807)"
                        ),
                    ))
                }
            },
            Tok::Float(v) => (Expr::Double(v), Kind::Number),
            Tok::Kw(Keyword::True) => (Expr::Bool(true), Kind::Bool),
            Tok::Kw(Keyword::False) => (Expr::Bool(false), Kind::Bool),
            Tok::Ident(name) => field(&name, pos)?,
            Tok::LParen => {
                self.bump();
                let mut inner = self.nested(pos, Self::or_expr)?;
                if self.peek() != &Tok::RParen {
                    return Err(invalid(
                        self.pos(),
                        format!(
                            "expected ')' to close the '(' at position {pos}, found {}",
                            self.found()
                        ),
                    ));
                }
                self.bump();
                inner.pos = pos;
                return Ok(inner);
            }
            Tok::Kw(Keyword::Null) => {
                return Err(invalid(
                    pos,
                    "NULL is not a value to compare with; test for it with name IS NULL \
                     or name IS NOT NULL",
                ))
            }
            _ => {
                return Err(invalid(
                    pos,
                    format!(
                        "expected a value {}, found {}",
                        self.previous(),
                        self.found()
                    ),
                ))
            }
        };
        self.bump();
        self.node(pos, expr, kind, 1)
    }
}

pub(super) fn cmp_op(tok: &Tok) -> Option<CmpOp> {
    Some(match tok {
        Tok::Eq => CmpOp::Eq,
        Tok::Ne => CmpOp::Ne,
        Tok::Lt => CmpOp::Lt,
        Tok::Le => CmpOp::Le,
        Tok::Gt => CmpOp::Gt,
        Tok::Ge => CmpOp::Ge,
        _ => return None,
    })
}

/// An identifier: a header when it starts with JMS, else a property.
fn field(name: &str, pos: usize) -> Result<(Expr, Kind)> {
    if !name.starts_with("JMS") {
        return Ok((
            Expr::Field(Field::Property(name.to_owned())),
            Kind::Property,
        ));
    }
    match Header::ALL.iter().find(|(_, n, _)| *n == name) {
        Some(&(header, _, numeric)) => {
            let kind = if numeric { Kind::Number } else { Kind::Str };
            Ok((Expr::Field(Field::Header(header)), kind))
        }
        None => {
            let names: Vec<&str> = Header::ALL.iter().map(|(_, n, _)| *n).collect();
            Err(invalid(
                pos,
                format!(
                    "{name} is not a header a selector can test (names starting with JMS are \
                     reserved); use one of {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn require_condition(p: &Parsed, role: &str) -> Result<()> {
    match p.kind {
        Kind::Bool | Kind::Property => Ok(()),
        Kind::Number | Kind::Str => Err(invalid(
            p.pos,
            format!(
                "{role} must be a condition, but this is {}; compare it, as in x > 0 or \
                 name = 'a'",
                p.kind.described()
            ),
        )),
    }
}

fn require_number(p: &Parsed, op_pos: usize) -> Result<()> {
    match p.kind {
        Kind::Number | Kind::Property => Ok(()),
        Kind::Bool | Kind::Str => Err(invalid(
            p.pos,
            format!(
                "arithmetic (at position {op_pos}) needs numbers, but this is {}",
                p.kind.described()
            ),
        )),
    }
}
