"""Argument checks shared by the reference and both frontends.

Each frontend reads shapes and dtypes off its own tensors and calls :func:`check_args`, so
every implementation rejects the same inputs with the same messages.
"""

from dataclasses import dataclass

from .dtypes import dtype_name


@dataclass(frozen=True)
class Problem:
    """The sizes of one accumulate call, after validation."""

    num_tokens: int  #: n = ids.size: every token counts, padding and skipped ones too
    hidden: int  #: H
    num_embeddings: int  #: V = main_grad.shape[0]
    padding_idx: int  #: in [0, V), or -1 for none
    grad_dtype: str  #: "float32", "bfloat16" or "float16"
    main_grad_dtype: str


def type_name(value) -> str:
    """The type of value for an error message: builtins by name (int, str), others with their
    module (numpy.bool, numpy.int64, torch.Tensor), so that numpy's bool is not shown as bool."""
    kind = type(value)
    module = kind.__module__.split(".")[0]
    return kind.__name__ if module == "builtins" else f"{module}.{kind.__name__}"


def normalize_padding_idx(padding_idx, num_embeddings: int) -> int:
    """padding_idx as torch.nn.functional.embedding takes it (None, or an int in [-V, V)) -> [0, V) or -1."""
    if padding_idx is None:
        return -1
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
        raise TypeError(f"padding_idx must be an int or None, got {type_name(padding_idx)}")
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"padding_idx={padding_idx} must lie in [-{num_embeddings}, {num_embeddings})")
    return padding_idx % num_embeddings


def check_args(
    *,
    ids_shape: tuple,
    ids_is_integer: bool,
    ids_dtype,
    grad_shape: tuple,
    grad_dtype,
    main_grad_shape: tuple,
    main_grad_dtype,
    padding_idx=None,
) -> Problem:
    """Check ids: int[*S], grad: [*S, H], main_grad: [V, H]; raise TypeError/ValueError naming the argument."""
    if not ids_is_integer:
        raise TypeError(f"ids must hold integers (int32 or int64), got {ids_dtype}")
    try:
        grad_name = dtype_name(grad_dtype)
    except TypeError:
        raise TypeError(f"grad must be float32, bfloat16 or float16, got {grad_dtype}") from None
    try:
        main_name = dtype_name(main_grad_dtype)
    except TypeError:
        raise TypeError(f"main_grad must be float32, bfloat16 or float16, got {main_grad_dtype}") from None
    ids_shape, grad_shape, main_grad_shape = tuple(ids_shape), tuple(grad_shape), tuple(main_grad_shape)
    if len(main_grad_shape) != 2:
        raise ValueError(f"main_grad must be 2-D [V, H], got shape {main_grad_shape}")
    if len(grad_shape) != len(ids_shape) + 1 or grad_shape[:-1] != ids_shape:
        raise ValueError(f"grad must have shape [*ids.shape, H] = [*{ids_shape}, H], got {grad_shape}")
    num_embeddings, hidden = main_grad_shape
    if grad_shape[-1] != hidden:
        raise ValueError(f"grad's last dimension ({grad_shape[-1]}) must equal main_grad's H ({hidden})")
    num_tokens = 1
    for d in ids_shape:
        num_tokens *= d
    return Problem(
        num_tokens=num_tokens,
        hidden=hidden,
        num_embeddings=num_embeddings,
        padding_idx=normalize_padding_idx(padding_idx, num_embeddings),
        grad_dtype=grad_name,
        main_grad_dtype=main_name,
    )


def check_masked(*, masked_shape: tuple, masked_is_bool: bool, masked_dtype, ids_shape: tuple) -> None:
    """Check accumulate's masked: bool [*S], ids' shape; raise TypeError/ValueError naming it.

    masked marks the tokens whose grad rows are taken as +0 and never read (Megatron's
    `input_mask`, whose tokens' rows its vocab-parallel lookup zeroes). The bits are those of
    the dense path on grad with those rows zeroed, which for rows that are +0 or -0 already
    are the dense path's on grad itself: +0 and -0 rows leave every sum alike (a sum that
    starts at +0 is never -0).
    """
    if not masked_is_bool:
        raise TypeError(f"masked must hold bools, got {masked_dtype}")
    if tuple(masked_shape) != tuple(ids_shape):
        raise ValueError(f"masked must have ids' shape {tuple(ids_shape)}, got {tuple(masked_shape)}")
