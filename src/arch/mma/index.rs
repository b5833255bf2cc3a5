//! Index expressions of the fragment helpers: a constant plus bit fields of the lane and element
//! index, each scaled. One value is both printed as C (in the generated helpers) and evaluated
//! in Rust (by the layout simulation), so the tests check the very expressions kernels run.

use std::fmt::Write;

/// The variables a helper's index depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Var {
    /// The lane within the wave (`lane` in C).
    Lane,
    /// The element slot within a fragment (`e` in C).
    Elem,
}

impl Var {
    fn c_name(self) -> &'static str {
        match self {
            Var::Lane => "lane",
            Var::Elem => "e",
        }
    }
}

/// `((var >> shift) & (2^width - 1)) * mul`, where `var` is known to be below `2^var_bits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub var: Var,
    pub shift: u32,
    pub width: u32,
    pub var_bits: u32,
    pub mul: u32,
}

impl Field {
    /// One bit of `var`.
    pub fn bit(var: Var, bit: u32, var_bits: u32, mul: u32) -> Field {
        Field {
            var,
            shift: bit,
            width: 1,
            var_bits,
            mul,
        }
    }

    fn eval(&self, lane: u32, e: u32) -> u32 {
        let v = match self.var {
            Var::Lane => lane,
            Var::Elem => e,
        };
        ((v >> self.shift) & ((1 << self.width) - 1)) * self.mul
    }

    fn c(&self) -> String {
        let mut s = self.var.c_name().to_string();
        if self.shift > 0 {
            s = format!("({s} >> {})", self.shift);
        }
        // The mask is implied where the field reaches the variable's top bit.
        if self.shift + self.width < self.var_bits {
            s = format!("({s} & {})", (1u32 << self.width) - 1);
        }
        match self.mul {
            1 => s,
            m if m.is_power_of_two() => format!("({s} << {})", m.trailing_zeros()),
            m => format!("({s} * {m})"),
        }
    }
}

/// A constant plus fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    pub fields: Vec<Field>,
    pub constant: u32,
}

impl Linear {
    pub fn new(fields: Vec<Field>, constant: u32) -> Linear {
        Linear { fields, constant }
    }

    /// Joins fields of one variable that are adjacent in both the index and the result
    /// (bits 2, 3, 4 of the lane to bits 0, 1, 2 of the row become one 3-bit field), and drops
    /// fields scaled by zero.
    pub fn merged(mut self) -> Linear {
        self.fields.retain(|f| f.mul != 0);
        self.fields.sort_by_key(|f| (f.var, f.shift));
        let mut out: Vec<Field> = Vec::new();
        for f in self.fields {
            if let Some(last) = out.last_mut() {
                if last.var == f.var
                    && last.shift + last.width == f.shift
                    && last.mul.checked_shl(last.width) == Some(f.mul)
                {
                    last.width += f.width;
                    continue;
                }
            }
            out.push(f);
        }
        Linear {
            fields: out,
            constant: self.constant,
        }
    }

    pub fn eval(&self, lane: u32, e: u32) -> u32 {
        self.fields.iter().map(|f| f.eval(lane, e)).sum::<u32>() + self.constant
    }

    /// The expression in C (an `int` of `lane` and `e`).
    pub fn c(&self) -> String {
        let mut terms: Vec<String> = self.fields.iter().map(Field::c).collect();
        if self.constant != 0 || terms.is_empty() {
            terms.push(self.constant.to_string());
        }
        let mut s = String::new();
        for (i, t) in terms.iter().enumerate() {
            if i > 0 {
                s.push_str(" + ");
            }
            let _ = write!(s, "{t}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_merge_print_and_evaluate_alike() {
        // lane bits 2, 3, 4 -> value bits 0, 1, 2; element bit 1 -> value bit 3.
        let l = Linear::new(
            vec![
                Field::bit(Var::Lane, 3, 5, 2),
                Field::bit(Var::Lane, 2, 5, 1),
                Field::bit(Var::Elem, 1, 3, 8),
                Field::bit(Var::Lane, 4, 5, 4),
                Field::bit(Var::Lane, 0, 5, 0),
            ],
            0,
        )
        .merged();
        assert_eq!(l.c(), "(lane >> 2) + (((e >> 1) & 1) << 3)");
        for lane in 0..32 {
            for e in 0..8 {
                assert_eq!(l.eval(lane, e), (lane >> 2) + 8 * ((e >> 1) & 1));
            }
        }
        assert_eq!(Linear::new(vec![], 0).c(), "0");
        assert_eq!(
            Linear::new(vec![Field::bit(Var::Lane, 4, 6, 24)], 8).c(),
            "(((lane >> 4) & 1) * 24) + 8"
        );
    }
}
