//! Selector text to tokens, each with the 1-based character position where it starts.

use std::fmt;

use super::invalid;
use crate::error::KernelError;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Kw(Keyword),
    Str(String),
    /// An exact numeric literal without its sign. It may be 2^63, which only `-` makes valid.
    Integer(u64),
    Float(f64),
    LParen,
    RParen,
    Comma,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keyword {
    Not,
    And,
    Or,
    Between,
    Like,
    In,
    Is,
    Null,
    True,
    False,
    Escape,
}

impl Keyword {
    const ALL: [(Keyword, &'static str); 11] = [
        (Keyword::Not, "NOT"),
        (Keyword::And, "AND"),
        (Keyword::Or, "OR"),
        (Keyword::Between, "BETWEEN"),
        (Keyword::Like, "LIKE"),
        (Keyword::In, "IN"),
        (Keyword::Is, "IS"),
        (Keyword::Null, "NULL"),
        (Keyword::True, "TRUE"),
        (Keyword::False, "FALSE"),
        (Keyword::Escape, "ESCAPE"),
    ];

    fn from_word(word: &str) -> Option<Keyword> {
        Self::ALL
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(word))
            .map(|&(kw, _)| kw)
    }

    pub(super) fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|&&(kw, _)| kw == self)
            .map_or("?", |&(_, name)| name)
    }
}

/// How errors name a token: `'='`, `AND`, `identifier color`, `end of selector`.
impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let symbol = match self {
            Tok::Ident(name) => return write!(f, "identifier {name}"),
            Tok::Kw(kw) => return f.write_str(kw.as_str()),
            Tok::Str(s) => return write!(f, "string '{}'", s.replace('\'', "''")),
            Tok::Integer(v) => return write!(f, "number {v}"),
            Tok::Float(v) => return write!(f, "number {v:?}"),
            Tok::End => return f.write_str("end of selector"),
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::Comma => ",",
            Tok::Eq => "=",
            Tok::Ne => "<>",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
        };
        write!(f, "'{symbol}'")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub tok: Tok,
    /// 1-based character position of the token's first character.
    pub pos: usize,
}

/// Splits `text` into tokens; the last one is always [`Tok::End`].
pub(super) fn tokenize(text: &str) -> Result<Vec<Token>, KernelError> {
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        at: 0,
    };
    let mut tokens = Vec::new();
    loop {
        while lexer.peek(0).is_some_and(char::is_whitespace) {
            lexer.at += 1;
        }
        let pos = lexer.at + 1;
        let tok = lexer.token()?;
        let end = tok == Tok::End;
        tokens.push(Token { tok, pos });
        if end {
            return Ok(tokens);
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

fn is_ident_part(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

struct Lexer {
    chars: Vec<char>,
    /// Index of the next character; its position is `at + 1`.
    at: usize,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let start = self.at;
        while self.peek(0).is_some_and(&keep) {
            self.at += 1;
        }
        self.chars[start..self.at].iter().collect()
    }

    fn token(&mut self) -> Result<Tok, KernelError> {
        let pos = self.at + 1;
        let Some(c) = self.peek(0) else {
            return Ok(Tok::End);
        };
        if is_ident_start(c) {
            let word = self.take_while(is_ident_part);
            return Ok(Keyword::from_word(&word).map_or(Tok::Ident(word), Tok::Kw));
        }
        if c.is_ascii_digit() || (c == '.' && self.peek(1).is_some_and(|d| d.is_ascii_digit())) {
            return self.number();
        }
        if c == '\'' {
            return self.string();
        }
        let next = self.peek(1);
        let (tok, len) = match (c, next) {
            ('<', Some('=')) => (Tok::Le, 2),
            ('<', Some('>')) => (Tok::Ne, 2),
            ('>', Some('=')) => (Tok::Ge, 2),
            ('<', _) => (Tok::Lt, 1),
            ('>', _) => (Tok::Gt, 1),
            ('=', _) => (Tok::Eq, 1),
            ('(', _) => (Tok::LParen, 1),
            (')', _) => (Tok::RParen, 1),
            (',', _) => (Tok::Comma, 1),
            ('+', _) => (Tok::Plus, 1),
            ('-', _) => (Tok::Minus, 1),
            ('*', _) => (Tok::Star, 1),
            ('/', _) => (Tok::Slash, 1),
            ('!', Some('=')) => return Err(invalid(pos, "'!=' is not SQL; write '<>'")),
            ('"', _) => {
                return Err(invalid(
                    pos,
                    "'\"' is not allowed: strings use single quotes, like 'red'",
                ))
            }
            _ => {
                return Err(invalid(
                    pos,
                    format!(
                        "unexpected character {c:?}; a selector uses names, numbers, \
                         'strings', parentheses and the operators = <> < <= > >= + - * /"
                    ),
                ))
            }
        };
        self.at += len;
        Ok(tok)
    }

    /// A quoted string; `''` inside it is one quote.
    fn string(&mut self) -> Result<Tok, KernelError> {
        let pos = self.at + 1;
        self.at += 1;
        let mut s = String::new();
        loop {
            match self.peek(0) {
                None => {
                    return Err(invalid(
                        pos,
                        "the string starting here is not terminated; close it with ' \
                         (write '' for a quote inside it)",
                    ))
                }
                Some('\'') if self.peek(1) == Some('\'') => {
                    s.push('\'');
                    self.at += 2;
                }
                Some('\'') => {
                    self.at += 1;
                    return Ok(Tok::Str(s));
                }
                Some(c) => {
                    s.push(c);
                    self.at += 1;
                }
            }
        }
    }

    /// `57`, `0x1F`, `7.`, `.5`, `7E3`, `5.2e-3`. A sign is a separate token.
    fn number(&mut self) -> Result<Tok, KernelError> {
        let pos = self.at + 1;
        if self.peek(0) == Some('0') && matches!(self.peek(1), Some('x' | 'X')) {
            self.at += 2;
            let digits = self.take_while(|c| c.is_ascii_hexdigit());
            if digits.is_empty() {
                return Err(invalid(
                    pos,
                    "a hexadecimal number needs digits after 0x, like 0x1F",
                ));
            }
            self.reject_glued_letter(pos)?;
            let value = u64::from_str_radix(&digits, 16).map_err(|_| too_large(pos))?;
            return Ok(Tok::Integer(value));
        }
        let start = self.at;
        let mut approximate = false;
        self.take_while(|c| c.is_ascii_digit());
        if self.peek(0) == Some('.') {
            approximate = true;
            self.at += 1;
            self.take_while(|c| c.is_ascii_digit());
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let exponent_pos = self.at + 1;
            approximate = true;
            self.at += 1;
            if matches!(self.peek(0), Some('+' | '-')) {
                self.at += 1;
            }
            if self.take_while(|c| c.is_ascii_digit()).is_empty() {
                return Err(invalid(
                    exponent_pos,
                    "the exponent needs digits, like 7E3 or 5.2E-3",
                ));
            }
        }
        self.reject_glued_letter(pos)?;
        let text: String = self.chars[start..self.at].iter().collect();
        if !approximate {
            return text
                .parse::<u64>()
                .map(Tok::Integer)
                .map_err(|_| too_large(pos));
        }
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Tok::Float(v)),
            _ => Err(invalid(
                pos,
                format!("the number {text} is outside the range of a double"),
            )),
        }
    }

    /// `57L` or `12abc` would otherwise lex as two tokens and fail later with a vaguer message.
    fn reject_glued_letter(&self, number_pos: usize) -> Result<(), KernelError> {
        match self.peek(0) {
            Some(c) if is_ident_part(c) || c == '.' => Err(invalid(
                self.at + 1,
                format!(
                    "unexpected {c:?} right after the number at position {number_pos}; \
                     numbers are digits (57), hexadecimal (0x39) or decimal (5.7E1)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

fn too_large(pos: usize) -> KernelError {
    invalid(
        pos,
        "the number is too large for an exact numeric (a long, at most 9223372036854775807); \
         add a decimal point to make it approximate",
    )
}
