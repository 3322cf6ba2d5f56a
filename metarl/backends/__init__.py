"""Stage backends behind one interface each, chosen by the `type` field of the run config."""
