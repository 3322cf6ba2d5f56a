"""Pure rules, each defined once: episode transitions, staleness and batches, the reward, group advantages, the retry backoff, an inner job's sequence length."""
