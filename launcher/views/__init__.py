"""What the commands print: the config, validation and recipe screens (``config``), the plan
(``plan``, with its JSON document), the layout search (``search``), local runs' status lines and
table (``runs``) and the `plot` image (``plot``, the only module that imports matplotlib)."""
