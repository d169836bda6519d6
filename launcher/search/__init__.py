"""`plan --search`: the layouts a backend runs, pruned by the validation rules and the backend
tables, ranked by the planner (``layouts``). Sits above plan/ and validate/: neither imports it."""
