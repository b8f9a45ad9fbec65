"""`localspec distill`: corpus building, teacher-forced features, head / draft training."""
