"""Loss-side utilities: the autograd-aware all-gather on dim 0."""

from nemo_dist.loss.dist_utils import all_gather_no_grad, all_gather_with_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]
