//! Reading a JavaScript request object (`{q, k, v, shape, causal, ...}`) field by field.
//! A field that is absent, `undefined` or `null` is `None`; one of the wrong type is an
//! `Invalid` error that names it, so the promise rejects with a one-line message.

use js_sys::{Array, ArrayBuffer, Float32Array, Reflect, Uint16Array, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wgpu_attention::{CausalAlignment, Error, FusedTiling, KernelChoice, Mask, Result};

/// A request object from JavaScript.
pub struct Request(JsValue);

/// Tensor data as JavaScript passed it: f32 values, or f16 bit patterns.
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
        }
    }
}

impl Request {
    pub fn new(value: JsValue) -> Result<Self> {
        if !value.is_object() {
            return Err(Error::invalid("request", "must be an object, e.g. {q, k, v, shape}"));
        }
        Ok(Request(value))
    }

    fn get(&self, key: &str) -> Result<Option<JsValue>> {
        let value = Reflect::get(&self.0, &JsValue::from_str(key))
            .map_err(|_| Error::invalid(key, "cannot be read from the request"))?;
        Ok((!value.is_undefined() && !value.is_null()).then_some(value))
    }

    /// A required field.
    fn need(&self, key: &str) -> Result<JsValue> {
        self.get(key)?.ok_or_else(|| Error::invalid(key, "is missing"))
    }

    /// A `Float32Array` (f32) or a `Uint16Array` of f16 bit patterns.
    pub fn data(&self, key: &str) -> Result<Data> {
        let value = self.need(key)?;
        if let Some(a) = value.dyn_ref::<Float32Array>() {
            Ok(Data::F32(a.to_vec()))
        } else if let Some(a) = value.dyn_ref::<Uint16Array>() {
            Ok(Data::F16(a.to_vec()))
        } else {
            Err(Error::invalid(
                key,
                "must be a Float32Array (f32) or a Uint16Array (f16 bit patterns)",
            ))
        }
    }

    /// An optional `Float32Array`.
    pub fn f32s(&self, key: &str) -> Result<Option<Vec<f32>>> {
        match self.get(key)? {
            None => Ok(None),
            Some(v) => match v.dyn_ref::<Float32Array>() {
                Some(a) => Ok(Some(a.to_vec())),
                None => Err(Error::invalid(key, "must be a Float32Array")),
            },
        }
    }

    /// Bytes from an `ArrayBuffer` or a `Uint8Array`.
    pub fn bytes(&self, key: &str) -> Result<Vec<u8>> {
        let value = self.need(key)?;
        if let Some(a) = value.dyn_ref::<Uint8Array>() {
            Ok(a.to_vec())
        } else if value.is_instance_of::<ArrayBuffer>() {
            Ok(Uint8Array::new(&value).to_vec())
        } else {
            Err(Error::invalid(key, "must be an ArrayBuffer or a Uint8Array"))
        }
    }

    /// A list of whole numbers (an array or a typed array), each in `0..=max`.
    pub fn counts(&self, key: &str, max: f64) -> Result<Option<Vec<usize>>> {
        let Some(value) = self.get(key)? else { return Ok(None) };
        if !Array::is_array(&value) && !ArrayBuffer::is_view(&value) {
            return Err(Error::invalid(key, "must be an array of whole numbers"));
        }
        Array::from(&value)
            .iter()
            .map(|x| match x.as_f64() {
                Some(n) if n.fract() == 0.0 && (0.0..=max).contains(&n) => Ok(n as usize),
                _ => Err(Error::invalid(
                    key,
                    format!("must hold whole numbers from 0 to {max}; found {x:?}"),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A list of exactly `n` whole numbers in `0..=max`.
    pub fn counts_exact<const N: usize>(&self, key: &str, max: f64, names: &str) -> Result<[usize; N]> {
        let list = self
            .counts(key, max)?
            .ok_or_else(|| Error::invalid(key, "is missing"))?;
        list.try_into()
            .map_err(|list: Vec<usize>| Error::invalid(key, format!("must be {names}; got {} numbers", list.len())))
    }

    /// An optional whole number of at least `min`.
    pub fn whole(&self, key: &str, min: usize) -> Result<Option<usize>> {
        match self.number(key)? {
            None => Ok(None),
            Some(n) if n.fract() == 0.0 && (min as f64..=f64::from(u32::MAX)).contains(&n) => Ok(Some(n as usize)),
            Some(_) => Err(Error::invalid(key, format!("must be a whole number of at least {min}"))),
        }
    }

    pub fn number(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key)? {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::invalid(key, "must be a number")),
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<String>> {
        match self.get(key)? {
            None => Ok(None),
            Some(v) => v
                .as_string()
                .map(Some)
                .ok_or_else(|| Error::invalid(key, "must be a string")),
        }
    }

    pub fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key)? {
            None => Ok(false),
            Some(v) => v.as_bool().ok_or_else(|| Error::invalid(key, "must be true or false")),
        }
    }

    /// `causal`: `"top-left"`, `"bottom-right"` or absent.
    pub fn causal(&self) -> Result<Option<CausalAlignment>> {
        match self.string("causal")?.as_deref() {
            None => Ok(None),
            Some("top-left") => Ok(Some(CausalAlignment::TopLeft)),
            Some("bottom-right") => Ok(Some(CausalAlignment::BottomRight)),
            Some(other) => Err(Error::invalid(
                "causal",
                format!("must be \"top-left\", \"bottom-right\" or absent; got \"{other}\""),
            )),
        }
    }

    /// `kernel`: `"auto"` (or absent), `"fused"`, `"materialized"` or `"decode"`.
    pub fn kernel(&self) -> Result<KernelChoice> {
        match self.string("kernel")?.as_deref() {
            None | Some("auto") => Ok(KernelChoice::Auto),
            Some("fused") => Ok(KernelChoice::Fused),
            Some("materialized") => Ok(KernelChoice::Materialized),
            Some("decode") => Ok(KernelChoice::Decode),
            Some(other) => Err(Error::invalid(
                "kernel",
                format!("must be auto, fused, materialized or decode; got \"{other}\""),
            )),
        }
    }

    /// `tiling`: the fused kernel's tiling, `"auto"` (or absent) or a name `info` lists.
    pub fn tiling(&self) -> Result<FusedTiling> {
        match self.string("tiling")? {
            None => Ok(FusedTiling::Auto),
            Some(name) => name.parse(),
        }
    }

    /// `keyLengths`: one valid key count per batch element.
    pub fn key_lengths(&self) -> Result<Option<Vec<u32>>> {
        Ok(self
            .counts("keyLengths", f64::from(u32::MAX))?
            .map(|v| v.into_iter().map(|n| n as u32).collect()))
    }

    /// `mask` with `maskShape` (broadcastable to `[B, H, Lq, Lk]`): a `Float32Array` is
    /// added to the scores; a `Uint8Array` is boolean (nonzero: the query may attend).
    pub fn mask(&self) -> Result<Option<Mask>> {
        let Some(value) = self.get("mask")? else {
            return Ok(None);
        };
        let shape = self
            .counts("maskShape", f64::from(u32::MAX))?
            .ok_or_else(|| Error::invalid("maskShape", "is needed with a mask"))?;
        if let Some(a) = value.dyn_ref::<Float32Array>() {
            Mask::additive(&shape, a.to_vec()).map(Some)
        } else if let Some(a) = value.dyn_ref::<Uint8Array>() {
            Mask::boolean(&shape, a.to_vec().into_iter().map(|x| x != 0).collect()).map(Some)
        } else {
            Err(Error::invalid(
                "mask",
                "must be a Float32Array (added to the scores) or a Uint8Array (nonzero: may attend)",
            ))
        }
    }
}
