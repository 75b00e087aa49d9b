"""The directions, orchestrated: load (:mod:`.load`), save (:mod:`.save`), convert
(:mod:`.convert`), every rank's plan (:mod:`.ranks`); the plan types and their findings."""
