"""Knowledge about ms-swift that tunedeck needs without importing it: the installed version,
its flag tables (extracted from its own argument dataclasses, cached per version), the flags
users copy from blogs and old versions with what they became. (Its log formats are read by
tunedeck.core.ingest, like every other tool's.)"""
