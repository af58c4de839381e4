"""The operators' dashboard (staff only): backends, the fair queue, workers, spend and budget
alerts across every tenant, live. It reads across apps, which only routing may."""
