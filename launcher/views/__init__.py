"""What the commands print: the config, validation and recipe screens (``config``), the plan
(``plan``, with its JSON document) and the layout search (``search``)."""
