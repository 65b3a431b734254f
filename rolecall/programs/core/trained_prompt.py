"""The prompt a trained role sees: its instructions and its inputs, without ChatAdapter's format lesson.

DSPy's ``ChatAdapter`` spends most of a demo-free prompt teaching the output format: a list of the fields with their
types, a template of every ``[[ ## field ## ]]`` section, and a closing "Respond with the corresponding output fields"
reminder (about 190 of the 280 tokens of OPERA's plan prompt). A role whose LoRA adapter was trained on its own
completions has learned that format, so once its adapter is trained demo-free the program sends it
:class:`TrainedChatAdapter` prompts instead:

    system:    the signature's instructions
    user:      [[ ## field ## ]] value, for each input field
    assistant: [[ ## output ## ]] value ... [[ ## completed ## ]]     (what the adapter was trained to write)

Completions are parsed exactly as ``ChatAdapter`` parses them. There is no JSON fallback: a retry in JSON mode would
send the role a prompt it was never trained on.

Example:
    >>> import dspy
    >>> class QA(dspy.Signature):
    ...     '''Answer briefly.'''
    ...     question: str = dspy.InputField()
    ...     answer: str = dspy.OutputField()
    >>> messages = TrainedChatAdapter().format(QA, demos=[], inputs={"question": "Where is Varn?"})
    >>> [m["content"] for m in messages]
    ['Answer briefly.', '[[ ## question ## ]]\\nWhere is Varn?']
"""

from __future__ import annotations

import textwrap

import dspy
from dspy.signatures.signature import Signature

__all__ = ["TrainedChatAdapter"]


class TrainedChatAdapter(dspy.ChatAdapter):
    """``ChatAdapter`` sections and parsing, with the system message cut to the instructions and no format reminder
    in the user message (see the module docstring)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("use_json_adapter_fallback", False)
        super().__init__(**kwargs)

    def format_system_message(self, signature: type[Signature]) -> str:
        """The signature's instructions, dedented."""
        return textwrap.dedent(signature.instructions).strip()

    def user_message_output_requirements(self, signature: type[Signature]) -> None:
        """None: the trained role needs no reminder of its output sections."""
        return None
