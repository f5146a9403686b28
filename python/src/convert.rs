//! Conversion: numpy arrays and Python values in, checked Rust buffers out (dtype, number of
//! dimensions, sizes), with errors that name the argument.

use eplb_core::{Placement, Shape};
use numpy::ndarray::ArrayViewD;
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::errors::{Error, err};

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn untyped<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().map_err(|_| {
        err(format!(
            "{what}: expected a numpy array, got {}",
            type_name(obj)
        ))
    })
}

pub(crate) fn dtype_name(a: &Bound<'_, PyUntypedArray>) -> String {
    a.dtype().to_string()
}

pub(crate) fn check_ndim(
    what: &str,
    a: &Bound<'_, PyUntypedArray>,
    allowed: &[usize],
) -> PyResult<()> {
    if allowed.contains(&a.ndim()) {
        return Ok(());
    }
    let want: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
    Err(err(format!(
        "{what}: expected {} dimensions, got {} (shape {:?})",
        want.join(" or "),
        a.ndim(),
        a.shape()
    )))
}

pub(crate) fn collect<T: Copy, U>(v: ArrayViewD<'_, T>, f: impl Fn(T) -> U) -> Vec<U> {
    // Logical (row-major) order whatever the strides: non-contiguous views are copied here.
    v.iter().map(|&x| f(x)).collect()
}

/// A numeric array read as `f64` in row-major order: `(shape, values)`.
/// Accepted dtypes: int32, int64, float32, float64 (any strides).
pub(crate) fn read_loads(
    obj: &Bound<'_, PyAny>,
    what: &str,
    ndims: &[usize],
) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let a = untyped(obj, what)?;
    check_ndim(what, a, ndims)?;
    let shape = a.shape().to_vec();
    let values = if let Ok(x) = obj.cast::<PyArrayDyn<f64>>() {
        collect(x.readonly().as_array(), |v| v)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<f32>>() {
        collect(x.readonly().as_array(), f64::from)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<i64>>() {
        collect(x.readonly().as_array(), |v| v as f64)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<i32>>() {
        collect(x.readonly().as_array(), f64::from)
    } else {
        return Err(err(format!(
            "{what}: dtype {} is not supported (expected int32, int64, float32 or float64)",
            dtype_name(a)
        )));
    };
    Ok((shape, values))
}

/// An integer array read as `i64` in row-major order: `(shape, values)`.
pub(crate) fn read_ids(
    obj: &Bound<'_, PyAny>,
    what: &str,
    ndims: &[usize],
) -> PyResult<(Vec<usize>, Vec<i64>)> {
    let a = untyped(obj, what)?;
    check_ndim(what, a, ndims)?;
    let shape = a.shape().to_vec();
    macro_rules! try_int {
        ($($t:ty),*) => {
            $(if let Ok(x) = obj.cast::<PyArrayDyn<$t>>() {
                return Ok((shape, collect(x.readonly().as_array(), |v| v as i64)));
            })*
        };
    }
    try_int!(i64, i32, i16, i8, u8, u16, u32);
    if let Ok(x) = obj.cast::<PyArrayDyn<u64>>() {
        let v = collect(x.readonly().as_array(), |v| i64::try_from(v).unwrap_or(-1));
        return Ok((shape, v));
    }
    Err(err(format!(
        "{what}: dtype {} is not supported (expected an integer dtype)",
        dtype_name(a)
    )))
}

pub(crate) fn dim_u16(what: &str, v: usize) -> PyResult<u16> {
    u16::try_from(v).map_err(|_| err(format!("{what} = {v} is too large (at most 65535)")))
}

/// `[L][R][S]` ids from `ids` (shape `[L,R,S]` or `[L,R*S]`), each checked to be in `0..N`.
pub(crate) fn placement_ids(
    what: &str,
    shape: &Shape,
    dims: &[usize],
    ids: &[i64],
) -> PyResult<Vec<u16>> {
    let (l, r, s) = (shape.layers(), shape.ranks(), shape.slots_per_rank());
    let ok = match dims {
        [a, b, c] => (*a, *b, *c) == (l, r, s),
        [a, b] => (*a, *b) == (l, r * s),
        _ => false,
    };
    if !ok {
        return Err(err(format!(
            "{what}: shape {dims:?} does not match [L={l}, R={r}, S={s}] (or [L, R*S = {}])",
            r * s
        )));
    }
    let n = shape.experts() as i64;
    let mut out = Vec::with_capacity(ids.len());
    for (i, &e) in ids.iter().enumerate() {
        if !(0..n).contains(&e) {
            let (layer, rest) = (i / (r * s), i % (r * s));
            return Err(err(format!(
                "{what}: layer {layer}, rank {}, slot {}: expert id {e} is outside 0..{n}",
                rest / s,
                rest % s
            )));
        }
        out.push(e as u16);
    }
    Ok(out)
}

/// Whether `v` is a bool: Python's or numpy's (`numpy.bool`, `numpy.bool_`).
pub(crate) fn is_bool(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyBool>()
        || v.get_type()
            .fully_qualified_name()
            .is_ok_and(|n| n == "numpy.bool" || n == "numpy.bool_")
}

/// A policy parameter's value: a Python int or float, or a numpy number (not a bool, Python's
/// or numpy's, and not a string).
pub(crate) fn param_f64(key: &str, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if is_bool(v) {
        return Err(err(format!(
            "parameter `{key}`: expected a number, got a bool"
        )));
    }
    if v.is_instance_of::<PyInt>() {
        let x: i64 = v
            .extract()
            .map_err(|_| err(format!("parameter `{key}`: integer out of range")))?;
        return Ok(x as f64);
    }
    if v.is_instance_of::<PyFloat>() {
        return v
            .extract::<f64>()
            .map_err(|_| err(format!("parameter `{key}`: not a float")));
    }
    // numpy scalars and other numbers.
    v.extract::<f64>().map_err(|_| {
        err(format!(
            "parameter `{key}`: expected a number, got {}",
            type_name(v)
        ))
    })
}

pub(crate) fn make_shape(
    layers: usize,
    experts: usize,
    ranks: usize,
    redundant: usize,
    ranks_per_node: Option<usize>,
    groups: Option<usize>,
) -> PyResult<Shape> {
    let (l, n, r) = (
        dim_u16("layers", layers)?,
        dim_u16("experts", experts)?,
        dim_u16("ranks", ranks)?,
    );
    let x = u32::try_from(redundant)
        .map_err(|_| err(format!("redundant = {redundant} is too large")))?;
    let rpn = dim_u16("ranks_per_node", ranks_per_node.unwrap_or(ranks))?;
    let g = dim_u16("groups", groups.unwrap_or(1))?;
    Ok(Shape::from_redundant(l, n, r, x)
        .and_then(|s| s.topology(rpn, g))
        .map_err(Error::from)?)
}

/// A placement `[L,R,S]` of any integer dtype: its shape (with `N` = the largest id + 1 unless
/// given) and its ids.
pub(crate) fn placement_arg(
    obj: &Bound<'_, PyAny>,
    experts: Option<usize>,
) -> PyResult<(Shape, Vec<u16>)> {
    let (dims, ids) = read_ids(obj, "placement", &[3])?;
    let (l, r, s) = (dims[0], dims[1], dims[2]);
    let n = match experts {
        Some(n) => n,
        None => ids
            .iter()
            .copied()
            .max()
            .map_or(0, |m| (m.max(-1) + 1) as usize),
    };
    let shape = Shape::new(
        dim_u16("layers", l)?,
        dim_u16("experts", n)?,
        dim_u16("ranks", r)?,
        dim_u16("slots per rank", s)?,
    )
    .map_err(|e| err(format!("placement: {e}")))?;
    let v = placement_ids("placement", &shape, &dims, &ids)?;
    Placement::new(shape, &v).map_err(|e| err(format!("placement: {e}")))?;
    Ok((shape, v))
}

/// The scalar conversions, in an interpreter this test binary starts (see `errors::tests`).
#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::IntoPyObjectExt;

    #[test]
    fn a_parameter_is_an_int_or_a_float_never_a_bool_or_a_string() {
        Python::initialize();
        Python::attach(|py| {
            let value = |v: Bound<'_, PyAny>| param_f64("swaps", &v).map_err(|e| e.to_string());
            assert_eq!(value(3i64.into_bound_py_any(py).unwrap()), Ok(3.0));
            assert_eq!(value(2.5f64.into_bound_py_any(py).unwrap()), Ok(2.5));
            let b = value(true.into_bound_py_any(py).unwrap());
            assert_eq!(
                b,
                Err("EplbError: parameter `swaps`: expected a number, got a bool".to_owned())
            );
            let s = value("3".into_bound_py_any(py).unwrap());
            assert_eq!(
                s,
                Err("EplbError: parameter `swaps`: expected a number, got str".to_owned())
            );
        });
    }

    #[test]
    fn a_shape_error_names_what_is_wrong() {
        Python::initialize();
        Python::attach(|py| {
            let e = make_shape(2, 8, 3, 2, None, None).map_err(|e| e.value(py).to_string());
            assert_eq!(
                e.err().as_deref(),
                Some(
                    "8 experts + 2 redundant is not a multiple of 3 ranks; nearest valid \
                     redundant counts: 1 or 4"
                )
            );
            assert!(make_shape(2, 8, 4, 4, None, None).is_ok());
            let big = make_shape(2, 70_000, 4, 4, None, None).map_err(|e| e.value(py).to_string());
            assert_eq!(
                big.err().as_deref(),
                Some("experts = 70000 is too large (at most 65535)")
            );
        });
    }
}
