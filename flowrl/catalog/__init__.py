"""Floor 0: the catalogues (names, import strings and typed traits) that the config validates
against and the rest of the code reads: no torch, nothing from a higher floor."""
