"""The embedded chat workloads now live in the product (the README demo uses them):
:mod:`sglang_spec_ext.bench.demo_workloads`. Re-exported here for the tests."""

from sglang_spec_ext.bench.demo_workloads import (  # noqa: F401
    EDITS,
    FUNCTIONS,
    NEW_NAMES,
    QUESTIONS,
    ChatCase,
    code_edit_cases,
    demo_cases,
    repeated_question_cases,
)
