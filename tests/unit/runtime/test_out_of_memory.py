"""Running out of memory is one line naming the step and the fix, and only that is."""

import pytest
import torch

from gradleak.errors import GradleakError, OutOfMemoryError
from gradleak.runtime.environment import out_of_memory_named


def test_an_allocation_the_machine_cannot_give_is_one_line_naming_the_step_and_fix():
    named = out_of_memory_named("the client's update of input 3", "use a smaller --batch-size")
    with pytest.raises(OutOfMemoryError) as error, named:
        torch.empty(2**50, dtype=torch.uint8)  # a petabyte: the allocator refuses
    message = str(error.value)
    assert message == (
        "the client's update of input 3 ran out of memory: use a smaller --batch-size"
    )
    assert isinstance(error.value, GradleakError) and isinstance(error.value, MemoryError)


def test_another_runtime_error_passes_through_unchanged():
    named = out_of_memory_named("a step", "a fix")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"), named:
        torch.ones(2, 3) @ torch.ones(2, 3)
