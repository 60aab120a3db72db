"""The type stubs (_native.pyi, the file shipped beside the compiled module) against the
compiled module itself: every public name, class, method, property and argument the
module has is in the stubs with the same names, kinds (positional, keyword-only) and
defaults, and the stubs name nothing the module lacks. PyO3 writes each function's and
method's ``__text_signature__`` from its ``#[pyo3(signature = ...)]``, so adding an
argument in Rust without adding it to the stubs fails here. Needs no GPU."""

import ast
import inspect
from pathlib import Path

import pytest

from wgpu_attention import _native

STUBS = Path(_native.__file__).with_name("_native.pyi")


def parse_stubs():
    """``(names, functions, classes)``: the module-level names the stubs declare, their
    functions ``{name: FunctionDef}`` and classes ``{name: {member: FunctionDef}}``.
    Private aliases (``_Array``) and imports are the stubs' own, not the module's."""
    tree = ast.parse(STUBS.read_text(), filename=str(STUBS))
    names, functions, classes = set(), {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
            continue
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_"))
            continue
        else:
            continue
        names.add(node.name)
    return names, functions, classes


def public(names):
    return {n for n in names if not n.startswith("_")}


def stub_parameters(fn):
    """A stub's parameters as ``[(name, kind, default)]`` (``inspect.Parameter`` kinds;
    the default a Python value, ``inspect.Parameter.empty`` when there is none)."""
    a = fn.args
    P = inspect.Parameter
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults = [P.empty] * (len(positional) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    params = [(x.arg, kind, d) for (x, kind), d in zip(positional, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, P.VAR_POSITIONAL, P.empty))
    params += [
        (x.arg, P.KEYWORD_ONLY, P.empty if d is None else ast.literal_eval(d))
        for x, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    if a.kwarg:
        params.append((a.kwarg.arg, P.VAR_KEYWORD, P.empty))
    return params


def native_parameters(obj):
    """The compiled object's parameters as ``stub_parameters`` gives them, from PyO3's
    ``__text_signature__``; None where it has none."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def without_self(params, what):
    assert params and params[0][0] == "self", f"{what}: the stub's first parameter is not self"
    return params[1:]


def assert_same_parameters(stub, native, what):
    """The same names in the same order, the same kinds and the same defaults (``self``,
    positional-only in PyO3's signatures, already dropped)."""
    def show(params):
        return ", ".join(f"{n}[{k.name}]" + ("" if d is inspect.Parameter.empty else f"={d!r}") for n, k, d in params)

    assert [(n, k) for n, k, _ in stub] == [(n, k) for n, k, _ in native], (
        f"{what}: the stubs have ({show(stub)}) but the module ({show(native)})"
    )
    for (name, _, want), (_, _, got) in zip(native, stub):
        assert type(got) is type(want) and got == want, (
            f"{what}: argument {name} defaults to {got!r} in the stubs but {want!r} in the module"
        )


def module_names():
    """The module's public names: everything in ``__all__`` (PyO3 lists each added item,
    ``__version__`` too) and every attribute without a leading underscore."""
    return set(getattr(_native, "__all__", ())) | public(dir(_native))


def test_the_stubs_name_every_public_name_and_no_other():
    names, _, _ = parse_stubs()
    native = module_names()
    assert not native - names, f"in the module but not in _native.pyi: {sorted(native - names)}"
    extra = {n for n in names - native if not n.startswith("_") or n == "__version__"}
    assert not extra, f"in _native.pyi but not in the module: {sorted(extra)}"


@pytest.mark.parametrize("name", sorted(n for n in module_names() if inspect.isbuiltin(getattr(_native, n))))
def test_function_arguments(name):
    _, functions, _ = parse_stubs()
    assert name in functions, f"{name} is not declared as a function in _native.pyi"
    native = native_parameters(getattr(_native, name))
    assert native is not None, f"{name} has no __text_signature__ (give it #[pyo3(signature = ...)])"
    assert_same_parameters(stub_parameters(functions[name]), native, name)


@pytest.mark.parametrize("name", sorted(n for n in module_names() if inspect.isclass(getattr(_native, n))))
def test_class_members_and_arguments(name):
    _, _, classes = parse_stubs()
    assert name in classes, f"{name} is not declared as a class in _native.pyi"
    cls, stub = getattr(_native, name), classes[name]

    # The constructor: PyO3 gives the class the #[new]'s signature; a class without one
    # cannot be constructed from Python, and its stub declares no __init__.
    native = native_parameters(cls)
    if native is None:
        assert "__init__" not in stub, f"{name}() cannot be called, but the stubs declare {name}.__init__"
    else:
        assert "__init__" in stub, f"{name}.__init__ is not in _native.pyi"
        assert_same_parameters(without_self(stub_parameters(stub["__init__"]), name), native, f"{name}()")

    members = public(vars(cls))
    assert not members - set(stub), f"{name} members not in _native.pyi: {sorted(members - set(stub))}"
    stale = {m for m in set(stub) - members if not m.startswith("__") or not hasattr(cls, m)}
    assert not stale, f"{name} members in _native.pyi but not in the module: {sorted(stale)}"

    for member in sorted(members):
        raw, decl = vars(cls)[member], stub[member]
        what = f"{name}.{member}"
        is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in decl.decorator_list)
        if inspect.isgetsetdescriptor(raw) or isinstance(raw, property):
            assert is_property, f"{what} is a property in the module but not in _native.pyi"
            continue
        assert not is_property, f"{what} is a method in the module but a property in _native.pyi"
        assert callable(raw), f"{what} is neither a method nor a property"
        native = native_parameters(raw)
        assert native is not None, f"{what} has no __text_signature__"
        # PyO3 writes the receiver as `$self`, which inspect reads as positional-only.
        assert native and native[0][0] == "self", f"{what}: no self in its signature"
        assert_same_parameters(without_self(stub_parameters(decl), what), native[1:], what)


def test_the_checks_catch_a_missing_argument():
    """The comparison itself: a stub missing a keyword, or with a wrong default, is caught."""
    tree = ast.parse("def f(a, b=None, *, c='x'): ...\ndef g(a, b=None): ...\ndef h(a, b=1, *, c='x'): ...")
    f, g, h = (stub_parameters(n) for n in tree.body)
    assert_same_parameters(f, f, "f")
    with pytest.raises(AssertionError, match="the stubs have"):
        assert_same_parameters(g, f, "g")
    with pytest.raises(AssertionError, match="defaults to 1"):
        assert_same_parameters(h, f, "h")
