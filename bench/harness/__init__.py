"""The harness: ``watch`` a loop, ``measure`` a loader against a step, the steps and plots."""
