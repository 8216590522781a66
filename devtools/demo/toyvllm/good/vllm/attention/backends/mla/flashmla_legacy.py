"""FlashMLA kernels for pre-Blackwell GPUs (removed once FLASHINFER_MLA covered them)."""

SUPPORTED_HEAD_SIZES = (576,)


def is_flashmla_supported(head_size):
    return head_size in SUPPORTED_HEAD_SIZES
