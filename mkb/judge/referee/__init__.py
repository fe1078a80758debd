"""The trusted referee process: draws, references, comparisons, policy, timing (imports torch)."""
