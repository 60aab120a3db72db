//! The 16-byte rule of cooperative-matrix kernels (docs/design.md, "Tensor cores"):
//! Vulkan wants the pointer of every cooperative load and store 16-byte aligned, and a
//! driver lays out workgroup variables in an order of its own (SPIR-V gives them no
//! offsets). So in a coop kernel every workgroup variable is a whole number of 16-byte
//! words, and every coop access's stride and offset is a whole number of them.
//!
//! Offsets (and strides known only at run time) are checked by a small alignment analysis over naga's IR: for each integer
//! expression, the largest power of two it is certainly a multiple of (literals and
//! constants by value, sums by the smaller, products by the product, loop counters and
//! `let`s through what is stored into them, function arguments through every call).
//! A value the analysis cannot see through (a builtin, an entry point's argument, a
//! load from memory, a float, a local whose address escapes into a call) counts as 1,
//! so the check errs on the side of failing.

use naga::{Arena, BinaryOperator, Block, Expression, Function, Handle, Literal, Module, Statement};
use std::collections::HashMap;

/// Beyond this, every alignment is the same for the rule.
const TOP: u64 = 1 << 20;

/// The largest power of two that divides `v` (0 divides by anything).
fn pow2_of(v: u64) -> u64 {
    if v == 0 {
        TOP
    } else {
        (1u64 << v.trailing_zeros()).min(TOP)
    }
}

fn literal_value(l: &Literal) -> Option<u64> {
    match *l {
        Literal::U32(v) => Some(v.into()),
        Literal::I32(v) => u64::try_from(v).ok(),
        Literal::U64(v) => Some(v),
        Literal::I64(v) => u64::try_from(v).ok(),
        Literal::AbstractInt(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

/// The value of a module-scope constant expression, where it is an integer.
fn global_value(module: &Module, e: Handle<Expression>) -> Option<u64> {
    match &module.global_expressions[e] {
        Expression::Literal(l) => literal_value(l),
        Expression::Constant(c) => global_value(module, module.constants[*c].init),
        _ => None,
    }
}

/// What the analysis knows: alignments of locals and arguments (per function).
#[derive(Default)]
struct Facts {
    /// (function key, local index) -> alignment of every value stored there.
    locals: HashMap<(usize, usize), u64>,
    /// (function key, argument index) -> alignment of every value passed there.
    arguments: HashMap<(usize, u32), u64>,
}

struct Analysis<'m> {
    module: &'m Module,
    /// Every function body: the module's functions, then its entry points.
    functions: Vec<&'m Function>,
    /// Function handle -> its key in `functions`.
    keys: HashMap<Handle<Function>, usize>,
    facts: Facts,
}

impl<'m> Analysis<'m> {
    fn new(module: &'m Module) -> Self {
        let mut functions = Vec::new();
        let mut keys = HashMap::new();
        for (handle, f) in module.functions.iter() {
            keys.insert(handle, functions.len());
            functions.push(f);
        }
        functions.extend(module.entry_points.iter().map(|ep| &ep.function));
        let mut analysis = Analysis {
            module,
            functions,
            keys,
            facts: Facts::default(),
        };
        analysis.solve();
        analysis
    }

    /// The alignment of expression `e` of function `key`, given the facts so far.
    fn align(&self, key: usize, e: Handle<Expression>) -> u64 {
        let f = self.functions[key];
        match &f.expressions[e] {
            Expression::Literal(l) => literal_value(l).map_or(1, pow2_of),
            Expression::Constant(c) => global_value(self.module, self.module.constants[*c].init).map_or(1, pow2_of),
            Expression::ZeroValue(_) => TOP,
            Expression::FunctionArgument(i) => *self.facts.arguments.get(&(key, *i)).unwrap_or(&TOP),
            Expression::Load { pointer } => match f.expressions[*pointer] {
                Expression::LocalVariable(v) => *self.facts.locals.get(&(key, v.index())).unwrap_or(&TOP),
                _ => 1,
            },
            // An integer conversion keeps the value; a float carries no alignment, and a
            // bitcast may come from one.
            Expression::As {
                expr,
                kind: naga::ScalarKind::Uint | naga::ScalarKind::Sint,
                convert: Some(_),
            } => self.align(key, *expr),
            Expression::Select { accept, reject, .. } => self.align(key, *accept).min(self.align(key, *reject)),
            Expression::Binary { op, left, right } => {
                let (a, b) = (self.align(key, *left), self.align(key, *right));
                match op {
                    BinaryOperator::Add | BinaryOperator::Subtract => a.min(b),
                    BinaryOperator::Multiply => a.saturating_mul(b).min(TOP),
                    BinaryOperator::And => a.max(b),
                    BinaryOperator::ShiftLeft => match &f.expressions[*right] {
                        Expression::Literal(l) => {
                            literal_value(l).map_or(1, |n| a.saturating_mul(1 << n.min(20)).min(TOP))
                        }
                        _ => a,
                    },
                    _ => 1,
                }
            }
            _ => 1,
        }
    }

    /// Narrows the facts until every stored value and passed argument agrees with them
    /// (starting from "aligned to anything", so the result is the most the stores allow).
    fn solve(&mut self) {
        for (key, f) in self.functions.iter().enumerate() {
            for (v, local) in f.local_variables.iter() {
                let init = local.init.map_or(TOP, |e| self.align(key, e));
                self.facts.locals.insert((key, v.index()), init);
            }
            // An entry point's arguments are builtins: nothing is known of them.
            if key >= self.module.functions.len() {
                for i in 0..f.arguments.len() {
                    let i = u32::try_from(i).expect("few arguments");
                    self.facts.arguments.insert((key, i), 1);
                }
            }
        }
        loop {
            let mut narrowed = Vec::new();
            for key in 0..self.functions.len() {
                self.visit(&self.functions[key].body, &mut |stmt, this| match stmt {
                    Statement::Store { pointer, value } => {
                        if let Expression::LocalVariable(v) = this.functions[key].expressions[*pointer] {
                            narrowed.push((true, key, v.index(), this.align(key, *value)));
                        }
                    }
                    Statement::Call {
                        function, arguments, ..
                    } => {
                        let callee = this.keys[function];
                        for (i, a) in arguments.iter().enumerate() {
                            narrowed.push((false, callee, i, this.align(key, *a)));
                            // A local whose address is passed may be stored through it.
                            if let Expression::LocalVariable(v) = this.functions[key].expressions[*a] {
                                narrowed.push((true, key, v.index(), 1));
                            }
                        }
                    }
                    _ => {}
                });
            }
            let mut changed = false;
            for (local, key, index, align) in narrowed {
                let slot = if local {
                    self.facts.locals.entry((key, index)).or_insert(TOP)
                } else {
                    let index = u32::try_from(index).expect("few arguments");
                    self.facts.arguments.entry((key, index)).or_insert(TOP)
                };
                if align < *slot {
                    *slot = align;
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    fn visit(&self, block: &Block, each: &mut dyn FnMut(&Statement, &Self)) {
        for stmt in block.iter() {
            each(stmt, self);
            match stmt {
                Statement::Block(b) => self.visit(b, each),
                Statement::If { accept, reject, .. } => {
                    self.visit(accept, each);
                    self.visit(reject, each);
                }
                Statement::Loop { body, continuing, .. } => {
                    self.visit(body, each);
                    self.visit(continuing, each);
                }
                Statement::Switch { cases, .. } => {
                    for case in cases {
                        self.visit(&case.body, each);
                    }
                }
                _ => {}
            }
        }
    }

    /// Bytes of one element a coop pointer points at, and the alignment (in elements)
    /// of the pointer's offset from the start of its variable: `&var[index]`,
    /// `&var[constant]` or `&var`.
    fn element_and_offset(&self, key: usize, pointer: Handle<Expression>) -> Result<(u64, u64), String> {
        let exprs: &Arena<Expression> = &self.functions[key].expressions;
        let (base, offset) = match exprs[pointer] {
            Expression::Access { base, index } => (base, self.align(key, index)),
            Expression::AccessIndex { base, index } => (base, pow2_of(index.into())),
            Expression::GlobalVariable(_) => (pointer, TOP),
            ref other => return Err(format!("a coop pointer the rule cannot read: {other:?}")),
        };
        let Expression::GlobalVariable(g) = exprs[base] else {
            return Err(format!(
                "a coop pointer into something other than a variable: {:?}",
                exprs[base]
            ));
        };
        let ty = &self.module.types[self.module.global_variables[g].ty].inner;
        let element = match ty {
            naga::TypeInner::Array { base, .. } => &self.module.types[*base].inner,
            other => other,
        };
        let width = match element {
            naga::TypeInner::Scalar(s) => u64::from(s.width),
            other => return Err(format!("a coop pointer to {other:?}")),
        };
        Ok((width, offset))
    }

    /// Every coop load and store of the module that breaks the rule, described.
    fn misaligned_accesses(&self) -> Vec<String> {
        let mut found = Vec::new();
        for key in 0..self.functions.len() {
            let f = self.functions[key];
            let mut accesses = Vec::new();
            for (_, e) in f.expressions.iter() {
                if let Expression::CooperativeLoad { data, .. } = e {
                    accesses.push(("load", *data));
                }
            }
            self.visit(&f.body, &mut |stmt, _| {
                if let Statement::CooperativeStore { data, .. } = stmt {
                    accesses.push(("store", *data));
                }
            });
            for (what, data) in accesses {
                let name = f.name.clone().unwrap_or_default();
                match self.element_and_offset(key, data.pointer) {
                    Err(e) => found.push(format!("{name}: {what}: {e}")),
                    Ok((width, offset)) => {
                        let offset = offset.saturating_mul(width);
                        if offset % 16 != 0 {
                            found.push(format!("{name}: {what} at an offset of {offset}-byte alignment"));
                        }
                        let stride = match &f.expressions[data.stride] {
                            Expression::Literal(l) => literal_value(l),
                            Expression::Constant(c) => global_value(self.module, self.module.constants[*c].init),
                            _ => None,
                        };
                        // A stride known only at run time (rows of a storage buffer)
                        // passes where the analysis proves it whole words.
                        let known_words = self.align(key, data.stride).saturating_mul(width) % 16 == 0;
                        match stride {
                            Some(s) if (s * width) % 16 == 0 => {}
                            Some(s) => found.push(format!("{name}: {what} with a stride of {} bytes", s * width)),
                            None if known_words => {}
                            None => found.push(format!(
                                "{name}: {what} with a stride not known to be a multiple of 16 bytes"
                            )),
                        }
                    }
                }
            }
        }
        found
    }
}

/// Where a module breaks the 16-byte rule: workgroup variables whose size is not a
/// multiple of 16 bytes, and coop accesses whose stride or offset may not be.
pub fn rule_breaks(module: &Module) -> Vec<String> {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).expect("layout");
    let mut found: Vec<String> = module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .filter(|(_, g)| layouter[g.ty].size % 16 != 0)
        .map(|(_, g)| {
            format!(
                "workgroup variable {} is {} bytes",
                g.name.as_deref().unwrap_or("?"),
                layouter[g.ty].size
            )
        })
        .collect();
    found.extend(Analysis::new(module).misaligned_accesses());
    found
}
