"""Utilities for downloading and initializing model weights."""

_SKIP = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


def filter_files_not_needed_for_inference(hf_weights_files):
    """Exclude files that are not needed for inference."""
    return [f for f in hf_weights_files if not any(f.endswith(x) for x in _SKIP)]
