"""embwgrad for JAX: ``main_grad = accumulate(ids, grad, main_grad)`` with Pallas kernels, main_grad donated."""

from .embedding_wgrad import accumulate

__all__ = ["accumulate"]
