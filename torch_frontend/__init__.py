"""embwgrad for PyTorch: ``accumulate(ids, grad, main_grad)`` adds in place with Triton kernels."""

from .embedding_wgrad import accumulate, can_accumulate

__all__ = ["accumulate", "can_accumulate"]
