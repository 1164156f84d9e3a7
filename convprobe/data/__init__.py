"""Data files shipped with convprobe (see TENSOR_CORE_VALIDATION.md beside this file)."""
