"""Pure rules of the loop: episode transitions, staleness and batches, the reward."""
