"""Type stubs of the compiled module (docstrings live on the objects: help() shows them)."""

from os import PathLike
from typing import Any, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Array = npt.NDArray[Any]
_Float = Union[npt.NDArray[np.float32], npt.NDArray[np.float16]]
_Kernel = Literal["auto", "fused", "materialized", "decode"]
_Precision = Literal["highest", "high", "medium"]
_Layout = Literal["bhsd", "bshd"]
_Alignment = Literal["top_left", "bottom_right"]
_DType = Literal["float32", "float16"]
_KvDType = Literal["int8"]
_Window = Tuple[Optional[int], Optional[int]]

class Context:
    def __init__(self, adapter: Optional[str] = None, backend: Optional[str] = None) -> None: ...
    @property
    def info(self) -> dict[str, Any]: ...
    @property
    def adapter_name(self) -> str: ...
    @property
    def supports_f16(self) -> bool: ...

def default_context() -> Context: ...

def scaled_dot_product_attention(
    query: _Float,
    key: _Float,
    value: _Float,
    attn_mask: Optional[_Array] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: _Alignment = "top_left",
    key_lengths: Optional[Union[Sequence[int], _Array]] = None,
    window: Optional[_Window] = None,
    alibi_slopes: Optional[Union[Sequence[float], _Array]] = None,
    softcap: Optional[float] = None,
    need_weights: bool = False,
    return_lse: bool = False,
    kernel: _Kernel = "auto",
    precision: _Precision = "highest",
    layout: _Layout = "bhsd",
    position_offset: Optional[int] = None,
    context: Optional[Context] = None,
) -> Union[_Float, Tuple[_Float, ...]]: ...

def sdpa_backward(
    query: _Float,
    key: _Float,
    value: _Float,
    out: _Float,
    lse: npt.NDArray[np.float32],
    d_out: _Float,
    attn_mask: Optional[_Array] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: _Alignment = "top_left",
    key_lengths: Optional[Union[Sequence[int], _Array]] = None,
    window: Optional[_Window] = None,
    alibi_slopes: Optional[Union[Sequence[float], _Array]] = None,
    softcap: Optional[float] = None,
    kernel: _Kernel = "auto",
    precision: _Precision = "highest",
    layout: _Layout = "bhsd",
    position_offset: Optional[int] = None,
    context: Optional[Context] = None,
) -> Tuple[_Float, _Float, _Float]: ...

def merge_attentions(
    outputs: Sequence[_Float],
    lses: Sequence[npt.NDArray[np.floating[Any]]],
    *,
    layout: _Layout = "bhsd",
    context: Optional[Context] = None,
) -> Tuple[_Float, npt.NDArray[np.float32]]: ...

class KvCache:
    def __init__(
        self,
        batch: int,
        heads_kv: int,
        capacity: int,
        head_dim: int,
        head_dim_v: Optional[int] = None,
        *,
        dtype: _DType = "float32",
        layout: _Layout = "bhsd",
        kv_dtype: Optional[_KvDType] = None,
        context: Optional[Context] = None,
    ) -> None: ...
    def append(self, key: _Float, value: _Float, counts: Optional[Sequence[int]] = None) -> None: ...
    def attend(
        self,
        query: _Float,
        attn_mask: Optional[_Array] = None,
        is_causal: bool = False,
        scale: Optional[float] = None,
        *,
        window: Optional[_Window] = None,
        alibi_slopes: Optional[Union[Sequence[float], _Array]] = None,
        softcap: Optional[float] = None,
        need_weights: bool = False,
        return_lse: bool = False,
        kernel: _Kernel = "auto",
        precision: _Precision = "highest",
    ) -> Union[_Float, Tuple[_Float, ...]]: ...
    def grow(self, capacity: int) -> None: ...
    def clear(self) -> None: ...
    @property
    def lengths(self) -> list[int]: ...
    @property
    def capacity(self) -> int: ...
    @property
    def dtype(self) -> _DType: ...
    @property
    def kv_dtype(self) -> Optional[_KvDType]: ...
    def keys(self) -> _Float: ...
    def values(self) -> _Float: ...

class SequenceId:
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class PagedKvCache:
    def __init__(
        self,
        pages: int,
        page_size: int,
        heads_kv: int,
        head_dim: int,
        head_dim_v: Optional[int] = None,
        *,
        dtype: _DType = "float32",
        layout: _Layout = "bhsd",
        context: Optional[Context] = None,
    ) -> None: ...
    def add_sequence(self) -> SequenceId: ...
    def remove_sequence(self, id: SequenceId) -> None: ...
    def sequence_length(self, id: SequenceId) -> int: ...
    @property
    def free_pages(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    def append(
        self, ids: Sequence[SequenceId], key: _Float, value: _Float, counts: Optional[Sequence[int]] = None
    ) -> None: ...
    def attend(
        self,
        ids: Sequence[SequenceId],
        query: _Float,
        attn_mask: Optional[_Array] = None,
        is_causal: bool = False,
        scale: Optional[float] = None,
        *,
        window: Optional[_Window] = None,
        alibi_slopes: Optional[Union[Sequence[float], _Array]] = None,
        softcap: Optional[float] = None,
        need_weights: bool = False,
        return_lse: bool = False,
        kernel: _Kernel = "auto",
        precision: _Precision = "highest",
    ) -> Union[_Float, Tuple[_Float, ...]]: ...

class MultiHeadAttention:
    def __init__(
        self,
        weights: Union[str, PathLike[str], Mapping[str, Any]],
        num_heads: int,
        num_kv_heads: Optional[int] = None,
        *,
        prefix: str = "",
        post_norm: Optional[bool] = None,
        norm_eps: float = 1e-5,
        dtype: _DType = "float32",
        context: Optional[Context] = None,
    ) -> None: ...
    def forward(
        self,
        query: _Float,
        key: Optional[_Float] = None,
        value: Optional[_Float] = None,
        attn_mask: Optional[_Array] = None,
        is_causal: bool = False,
        *,
        key_lengths: Optional[Union[Sequence[int], _Array]] = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        scale: Optional[float] = None,
        kernel: _Kernel = "auto",
    ) -> Union[_Float, Tuple[_Float, npt.NDArray[np.float32]]]: ...
    def backward(
        self,
        d_out: _Float,
        query: _Float,
        key: Optional[_Float] = None,
        value: Optional[_Float] = None,
        attn_mask: Optional[_Array] = None,
        is_causal: bool = False,
        *,
        key_lengths: Optional[Union[Sequence[int], _Array]] = None,
        scale: Optional[float] = None,
        kernel: _Kernel = "auto",
    ) -> dict[str, npt.NDArray[np.float32]]: ...
    @property
    def embed_dim(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def dtype(self) -> _DType: ...
