//! An op's attributes as files and dumps hold them: written ([`Op::attrs`], [`Op::display`]) and
//! parsed ([`Op::parse`]) by the same table, apart from the enum itself (`op.rs`).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

use super::dtype::DType;
use super::expr::Expr;
use super::gemm::{Gemm, NormKind, View};
use super::op::{Op, OpKind, OpParseError};
use super::scalar::{number_value, parse_number};
use super::shape::Shape;
use super::values::{Append, Attention, BinaryOp, Init, MaskKind, ReduceOp, Sample, UnaryOp};

impl Op {
    /// The op's attributes in a fixed order, as written to files and dumps. Attributes equal to
    /// their default are left out.
    pub fn attrs(&self) -> Vec<(&'static str, Value)> {
        let mut a: Vec<(&'static str, Value)> = Vec::new();
        match self {
            Op::Input {
                dtype,
                shape,
                sample,
            } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
                if *sample != Sample::Normal {
                    a.push(("sample", json(sample)));
                }
            }
            Op::State { dtype, shape } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
            }
            Op::Weight {
                dtype,
                shape,
                init,
                quant,
            } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
                if *init != Init::Normal {
                    a.push(("init", json(init)));
                }
                if let Some(q) = quant {
                    a.push(("quant", json(q)));
                }
            }
            Op::Constant {
                dtype,
                shape,
                values,
            } => {
                a.push(("dtype", json(dtype)));
                if shape.rank() > 0 {
                    a.push(("shape", json(&shape.0)));
                }
                let vals: Vec<Value> = values.iter().map(|v| number_value(*v)).collect();
                if vals.len() == 1 {
                    a.push(("value", vals[0].clone()));
                } else {
                    a.push(("value", Value::Array(vals)));
                }
            }
            Op::CausalMask { sq, sk, offset } => {
                a.push(("sq", json(sq)));
                a.push(("sk", json(sk)));
                if *offset != 0 {
                    a.push(("offset", json(offset)));
                }
            }
            Op::Reshape { shape } => a.push(("shape", json(shape))),
            Op::Permute { perm } => a.push(("perm", json(perm))),
            Op::Expand { shape } => a.push(("shape", json(shape))),
            Op::Concat { axis } | Op::ArgMax { axis } => a.push(("axis", json(axis))),
            Op::CacheWrite { axis, rope } => {
                a.push(("axis", json(axis)));
                if let Some(theta) = rope {
                    a.push(("rope_theta", json(theta)));
                }
            }
            Op::Slice { axis, start, end } => {
                a.push(("axis", json(axis)));
                a.push(("start", json(start)));
                a.push(("end", json(end)));
            }
            Op::Gather
            | Op::Binary(_)
            | Op::Where
            | Op::Unary(_)
            | Op::MatMul
            | Op::PagedCacheWrite => {}
            Op::PagedAttention {
                scale,
                window,
                append,
            } => {
                a.push(("scale", json(scale)));
                if let Some(w) = window {
                    a.push(("window", json(w)));
                }
                if let Some(ap) = append {
                    a.push(("append_theta", json(&ap.theta)));
                    if !ap.factors.is_empty() {
                        a.push(("append_factors", json(&ap.factors)));
                    }
                }
            }
            Op::Cast { to } => a.push(("to", json(to))),
            Op::Reduce { axes, keepdim, .. } => {
                a.push(("axes", json(axes)));
                if *keepdim {
                    a.push(("keepdim", json(keepdim)));
                }
            }
            Op::Softmax { axis } => a.push(("axis", json(axis))),
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => a.push(("eps", json(eps))),
            Op::Rope {
                theta,
                offset,
                factors,
            } => {
                a.push(("theta", json(theta)));
                if *offset != 0 {
                    a.push(("offset", json(offset)));
                }
                if !factors.is_empty() {
                    a.push(("factors", json(factors)));
                }
            }
            Op::FlashAttention(att) => {
                a.push(("scale", json(&att.scale)));
                if att.causal {
                    a.push(("causal", json(&att.causal)));
                }
                if att.causal_offset != 0 {
                    a.push(("causal_offset", json(&att.causal_offset)));
                }
                if let Some(w) = att.window {
                    a.push(("window", json(&w)));
                }
                if att.mask != MaskKind::None {
                    a.push(("mask", json(&att.mask)));
                }
                if att.kv_len {
                    a.push(("kv_len", json(&att.kv_len)));
                }
                if let Some(ap) = &att.append {
                    a.push(("append_theta", json(&ap.theta)));
                    if !ap.factors.is_empty() {
                        a.push(("append_factors", json(&ap.factors)));
                    }
                }
            }
            Op::FusedElementwise(expr) => a.push(("expr", expr.to_json())),
            Op::Gemm(g) => {
                a.push(("dims", json(&g.dims)));
                a.push(("a", json(&g.a)));
                a.push(("b", json(&g.b)));
                a.push(("out", json(&g.out)));
                if !g.extras.is_empty() {
                    a.push(("extras", json(&g.extras)));
                }
                if let Some(e) = &g.epilogue {
                    a.push(("epilogue", e.to_json()));
                }
                if g.paired {
                    a.push(("paired", json(&g.paired)));
                }
                if let Some(p) = &g.prologue {
                    a.push(("prologue", json(p)));
                }
                a.push(("shape", json(&g.shape.0)));
            }
        }
        a
    }

    /// Builds an op from its name and attributes (the inverse of [`Op::name`] + [`Op::attrs`]).
    /// Unknown attribute names are refused, so a misspelt attribute is never silently ignored.
    pub fn parse(name: &str, attrs: &Map<String, Value>) -> Result<Op, OpParseError> {
        let mut a = AttrReader::new(attrs);
        // The kind decides the attributes; a name outside `Op::all_names` is unknown.
        let kind = OpKind::from_name(name).ok_or(OpParseError::UnknownOp)?;
        let op = match kind {
            OpKind::Input => Op::Input {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
                sample: a.opt("sample")?.unwrap_or_default(),
            },
            OpKind::State => Op::State {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
            },
            OpKind::Weight => Op::Weight {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
                init: a.opt("init")?.unwrap_or_default(),
                quant: a.opt("quant")?,
            },
            OpKind::Constant => Op::Constant {
                dtype: a.opt("dtype")?.unwrap_or(DType::F32),
                shape: Shape(a.opt("shape")?.unwrap_or_default()),
                values: a.values("value")?,
            },
            OpKind::CausalMask => Op::CausalMask {
                sq: a.req("sq")?,
                sk: a.req("sk")?,
                offset: a.opt("offset")?.unwrap_or(0),
            },
            OpKind::Reshape => Op::Reshape {
                shape: a.req("shape")?,
            },
            OpKind::Permute => Op::Permute {
                perm: a.req("perm")?,
            },
            OpKind::Expand => Op::Expand {
                shape: a.req("shape")?,
            },
            OpKind::Concat => Op::Concat {
                axis: a.req("axis")?,
            },
            OpKind::Slice => Op::Slice {
                axis: a.req("axis")?,
                start: a.req("start")?,
                end: a.req("end")?,
            },
            OpKind::Gather => Op::Gather,
            OpKind::Where => Op::Where,
            OpKind::Cast => Op::Cast { to: a.req("to")? },
            OpKind::Softmax => Op::Softmax {
                axis: a.req("axis")?,
            },
            OpKind::LayerNorm => Op::LayerNorm {
                eps: a.opt("eps")?.unwrap_or(1e-5),
            },
            OpKind::RmsNorm => Op::RmsNorm {
                eps: a.opt("eps")?.unwrap_or(1e-6),
            },
            OpKind::Rope => Op::Rope {
                theta: a.opt("theta")?.unwrap_or(10000.0),
                offset: a.opt("offset")?.unwrap_or(0),
                factors: a.opt("factors")?.unwrap_or_default(),
            },
            OpKind::MatMul => Op::MatMul,
            OpKind::FusedElementwise => Op::FusedElementwise(a.expr("expr")?),
            OpKind::Gemm => Op::Gemm(Box::new(Gemm {
                dims: a.req("dims")?,
                a: a.req("a")?,
                b: a.req("b")?,
                out: a.req("out")?,
                extras: a.opt("extras")?.unwrap_or_default(),
                epilogue: a.opt_expr("epilogue")?,
                shape: Shape(a.req("shape")?),
                prologue: a.opt("prologue")?,
                paired: a.opt("paired")?.unwrap_or(false),
            })),
            OpKind::FlashAttention => Op::FlashAttention(Attention {
                scale: a.req("scale")?,
                causal: a.opt("causal")?.unwrap_or(false),
                causal_offset: a.opt("causal_offset")?.unwrap_or(0),
                window: a.opt("window")?,
                mask: a.opt("mask")?.unwrap_or_default(),
                kv_len: a.opt("kv_len")?.unwrap_or(false),
                append: match a.opt("append_theta")? {
                    None => None,
                    Some(theta) => Some(Append {
                        theta,
                        factors: a.opt("append_factors")?.unwrap_or_default(),
                    }),
                },
            }),
            OpKind::CacheWrite => Op::CacheWrite {
                axis: a.req("axis")?,
                rope: a.opt("rope_theta")?,
            },
            OpKind::PagedCacheWrite => Op::PagedCacheWrite,
            OpKind::PagedAttention => Op::PagedAttention {
                scale: a.req("scale")?,
                window: a.opt("window")?,
                append: match a.opt("append_theta")? {
                    None => None,
                    Some(theta) => Some(Append {
                        theta,
                        factors: a.opt("append_factors")?.unwrap_or_default(),
                    }),
                },
            },
            OpKind::ArgMax => Op::ArgMax {
                axis: a.req("axis")?,
            },
            // `from_name` found the kind by this name among the family's names, so the lookups
            // below find it too; an error is kept rather than a panic all the same.
            OpKind::Binary => Op::Binary(BinaryOp::from_name(name).ok_or(OpParseError::UnknownOp)?),
            OpKind::Unary => Op::Unary(UnaryOp::from_name(name).ok_or(OpParseError::UnknownOp)?),
            OpKind::Reduce => Op::Reduce {
                op: ReduceOp::from_name(name).ok_or(OpParseError::UnknownOp)?,
                axes: a.req("axes")?,
                keepdim: a.opt("keepdim")?.unwrap_or(false),
            },
        };
        a.finish()?;
        Ok(op)
    }

    /// `name[attr=value, ...]`, the op as the text printer shows it.
    pub fn display(&self) -> String {
        // A source's dtype and shape are its type, which every dump prints beside it.
        let mut attrs = self.attrs();
        if self.is_source() {
            attrs.retain(|(k, _)| *k != "dtype" && *k != "shape");
        }
        if attrs.is_empty() {
            return self.name().to_string();
        }
        let body: Vec<String> = attrs
            .iter()
            .map(|(k, v)| match (self, *k) {
                (Op::FusedElementwise(e), "expr") => format!("{e}"),
                (Op::Gemm(g), "epilogue") => match &g.epilogue {
                    Some(e) => format!("epilogue={e}"),
                    None => String::new(),
                },
                (Op::Gemm(g), view @ ("a" | "b" | "out")) => {
                    let v = match view {
                        "a" => &g.a,
                        "b" => &g.b,
                        _ => &g.out,
                    };
                    format!("{view}={}", view_text(v))
                }
                (Op::Gemm(g), "prologue") => match &g.prologue {
                    Some(p) => format!("prologue={}(eps={})", prologue_name(p.norm), p.eps),
                    None => String::new(),
                },
                (Op::Gemm(g), "extras") => format!(
                    "extras=[{}]",
                    g.extras
                        .iter()
                        .map(view_text)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (Op::Gemm(g), "dims") if g.dims.batch.is_empty() => {
                    format!("m={:?}, n={:?}, k={:?}", g.dims.m, g.dims.n, g.dims.k)
                }
                (Op::Gemm(g), "dims") => format!(
                    "batch={:?}, m={:?}, n={:?}, k={:?}",
                    g.dims.batch, g.dims.m, g.dims.n, g.dims.k
                ),
                _ => format!("{k}={}", compact_value(v)),
            })
            .collect();
        format!("{}[{}]", self.name(), body.join(", "))
    }
}

fn json<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect("attribute types serialise to JSON")
}

/// A prologue's normalisation as dumps show it: the name of the op it folds.
fn prologue_name(n: NormKind) -> &'static str {
    match n {
        NormKind::Rms => "rms_norm",
        NormKind::Layer => "layer_norm",
    }
}

/// A Gemm view as dumps show it: strides per sub-axis, `batch|rows|cols`.
fn view_text(v: &View) -> String {
    let list = |s: &[usize]| {
        s.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    if v.batch.is_empty() {
        format!("({}|{})", list(&v.rows), list(&v.cols))
    } else {
        format!("({}|{}|{})", list(&v.batch), list(&v.rows), list(&v.cols))
    }
}

/// Short rendering of an attribute value for dumps; long constant lists are elided.
fn compact_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.len() > 8 => {
            let head: Vec<String> = items[..4].iter().map(compact_value).collect();
            format!("[{}, … {} values]", head.join(", "), items.len())
        }
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(compact_value).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// Reads attributes by name, remembering which were used so unknown ones can be refused.
struct AttrReader<'a> {
    map: &'a Map<String, Value>,
    used: BTreeSet<&'static str>,
}

impl<'a> AttrReader<'a> {
    fn new(map: &'a Map<String, Value>) -> Self {
        AttrReader {
            map,
            used: BTreeSet::new(),
        }
    }

    fn opt<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<Option<T>, OpParseError> {
        self.used.insert(key);
        match self.map.get(key) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| OpParseError::Attribute(format!("attribute `{key}`: {e}"))),
        }
    }

    fn req<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<T, OpParseError> {
        self.opt(key)?
            .ok_or_else(|| OpParseError::Attribute(format!("missing attribute `{key}`")))
    }

    fn values(&mut self, key: &'static str) -> Result<Vec<f64>, OpParseError> {
        self.used.insert(key);
        let bad = |why: String| {
            OpParseError::Attribute(format!(
                "attribute `{key}` must be a number, \"inf\", \"-inf\", \"nan\" or a flat list \
                 of them: {why}"
            ))
        };
        match self.map.get(key) {
            None => Err(OpParseError::Attribute(format!(
                "missing attribute `{key}`"
            ))),
            Some(Value::Array(items)) => {
                items.iter().map(|v| parse_number(v).map_err(bad)).collect()
            }
            Some(v) => Ok(vec![parse_number(v).map_err(bad)?]),
        }
    }

    fn opt_expr(&mut self, key: &'static str) -> Result<Option<Expr>, OpParseError> {
        match self.map.get(key) {
            None => {
                self.used.insert(key);
                Ok(None)
            }
            Some(_) => self.expr(key).map(Some),
        }
    }

    fn expr(&mut self, key: &'static str) -> Result<Expr, OpParseError> {
        self.used.insert(key);
        let v = self
            .map
            .get(key)
            .ok_or_else(|| OpParseError::Attribute(format!("missing attribute `{key}`")))?;
        Expr::from_json(v).map_err(|e| OpParseError::Attribute(format!("attribute `{key}`: {e}")))
    }

    fn finish(self) -> Result<(), OpParseError> {
        let unknown: Vec<&str> = self
            .map
            .keys()
            .map(String::as_str)
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(OpParseError::Attribute(format!(
                "unknown attribute(s): {}",
                unknown.join(", ")
            )))
        }
    }
}
