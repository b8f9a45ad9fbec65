"""Model pairs: models.yaml (registry), loading targets and proposers (dtype, quantization), data folders (paths)."""
