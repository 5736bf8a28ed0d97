"""embwgrad for PyTorch: ``accumulate(ids, grad, main_grad)`` adds in place with Triton kernels;
``embedding(ids, weight)`` is the lookup whose backward adds into ``weight.main_grad``;
``torch_frontend.megatron.use_embwgrad(model)`` gives Megatron's VocabParallelEmbedding that lookup."""

from .autograd import embedding
from .embedding_wgrad import accumulate, can_accumulate

__all__ = ["accumulate", "can_accumulate", "embedding"]
