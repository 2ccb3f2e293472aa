"""A section record (core/records.py) as the `ConfigDict` the user's config holds: the one
direction from declarations to ml-collections, apart from the schema that composes them, so
a part of run/ declaring its own section (the population's) builds its dict without
importing the schema."""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from jaxrl_frontier.core import records


def section(record: type) -> ml_collections.ConfigDict:
    """The config section a record declares (core/records.py): its keys at their defaults;
    an unset key (None) a placeholder of its type, so the command line can set it."""
    s = ml_collections.ConfigDict()
    for f in records.keys_of(record):
        default = records.default_of(f)
        if records.subsection(f):
            s[f.name] = section(records.subsection(f))
        elif records.is_free(f):
            s[f.name] = ml_collections.ConfigDict(default)
        elif default is None:
            s[f.name] = config_dict.placeholder(records.unset_type(record, f.name))
        else:
            s[f.name] = default
    return s
