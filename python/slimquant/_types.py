"""Small value types the compiled module returns."""
from typing import List, NamedTuple, Optional, Union


class ValueInfo(NamedTuple):
    """A model input or output: name, numpy dtype name ('float32', ...; None when the model does not
    say) and shape (None when the rank is unknown; a dimension is an int, a symbolic name or None)."""

    name: str
    dtype: Optional[str]
    shape: Optional[List[Union[int, str, None]]]
