"""Job states and the decisions that move them.

Owns the (from, to) rule table and the one locked `transition` (`states`), claiming a job
(`claims`), and `policy`: how an attempt's outcome settles (cancel wins, a pause that
finished succeeded, the retry budget, which failures retry) and what an expired lease
becomes. Routes, tasks and the reconciler report what happened and call these.

May import: the standard library, sqlalchemy, `jobs.store`, `jobs.recipe`.
"""
