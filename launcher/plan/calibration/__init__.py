"""The planner's fitted constants and error bands, and the published reference runs they are fitted
on."""
