"""The training runtime, run inside each launched rank. Imports torch; plan/validate never do."""
