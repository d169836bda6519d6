"""Chat, instruct and preference records: reading, checking, rendering into token/role rows, the
built-in sets, and the report of a prepared chat folder."""
