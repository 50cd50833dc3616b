"""Named limits of the expression language.

Rules kept here:
- Every limit is a module constant named ``<what>_<unit>_max`` (or ``_min``), with a
  comment saying why it has the value it has.
- Together they guarantee that no filter text can make ``compile`` run for more than a
  second or hold memory out of proportion to its own length, and that no compiled
  filter can spend more than a fraction of a second on one message.
- Only this module holds numbers that bound work; the other modules import them.
"""

from __future__ import annotations

#: Longest filter text accepted. Real filters are a few hundred characters; the long
#: ones are `IN (...)` lists of ids, and 128 KiB holds about 10,000 of those. Parsing
#: and compiling this much text stays well under a second (see tests/expr/test_limits).
source_chars_max = 131_072

#: Deepest nesting of the syntax tree (parentheses, NOT, unary minus, function calls
#: and left-associative chains such as `1 + 1 + 1`). The parser and the compiler
#: recurse on the tree, and Python refuses generated source nested more than 200
#: parentheses deep; 64 leaves room for both with a wide margin.
nesting_depth_max = 64

#: Most syntax-tree nodes in one expression, not counting the literal items of
#: IN / BEGINS WITH / ENDS WITH lists (they become one frozen set, cheap to compile).
#: Each other node turns into about 100 characters of generated Python, and CPython
#: compiles about 10 MB/s of it, so 4,096 nodes compile in well under half a second.
node_count_max = 4_096

#: Most items in one IN / BEGINS WITH / ENDS WITH list. Bounded anyway by
#: source_chars_max; named so the error says what was exceeded.
list_items_max = 16_384

#: Longest LIKE pattern. PCRE users write short patterns; the regex safety analysis
#: and the stdlib compiler are linear-ish in the pattern, so 512 keeps both instant.
regex_pattern_chars_max = 512

#: Most LIKE operators in one expression. Checking and compiling a long pattern costs
#: up to about a millisecond, so 128 of them stay far under a second.
regex_count_max = 128

#: Most code points above 255 that the character classes of all LIKE patterns of one
#: expression may span (``[\u0100-\uffff]`` spans 65,280). The stdlib regex compiler
#: builds a table per class in time proportional to that span (about 6 ms for the
#: whole Basic Multilingual Plane, 12 ms ignoring case), so 262,144 keeps compiling
#: every class of an expression under about 50 ms. ASCII classes cost nothing here.
regex_class_chars_max = 262_144

#: Work budget of one LIKE evaluation, in the "ticks" of the cost model in regex.py
#: (about 1.2e9 per second on CPython 3.11's regex engine: 1 per character scanned by
#: a simple repeat, 8 per backtracking step). The worst accepted case of any pattern
#: then takes about 0.2 s on a development machine: under the one-second promise with
#: margin for a slower host.
regex_cost_ticks_max = 240_000_000

#: Longest subject any LIKE searches. A pattern whose cost model allows less gets a
#: smaller limit (see regex.py); a longer subject makes LIKE UNKNOWN, never a guess.
regex_subject_chars_max = 1_048_576

#: A pattern whose cost model would allow subjects shorter than this is rejected at
#: compile time: it backtracks too much to be useful on real field values.
regex_subject_chars_min = 128

#: Longest string that is read as a number. A double needs at most ~330 characters
#: to be written exactly; longer digit strings are treated as non-numeric text so
#: that conversion never costs more than a short scan.
number_text_chars_max = 400

#: Most element pairs one comparison of two arrays tries (``/a = /b`` is TRUE if any
#: pair is). Without a cap two 100,000-element arrays would cost 10^10 comparisons;
#: 100,000 pairs take about 30 ms. Past the cap, with no TRUE pair yet, the answer is
#: UNKNOWN.
array_pairs_max = 100_000

#: Longest string a function may build (CONCAT, REPLACE, ...). Longer results are
#: NULL, so that nested string functions cannot multiply memory without bound.
string_result_chars_max = 1_048_576

#: STRFTIME's result is capped at 128 bytes (AMPS documents this cap).
strftime_result_bytes_max = 128

#: Longest format or time string STRFTIME / STRPTIME accept; longer gives NULL.
#: Keeps the stdlib time functions (which build their output in full) cheap.
time_text_chars_max = 1_024

#: Compiled expressions kept by `compile` (LRU by source text). Subscriptions reuse a
#: handful of filters; 1,024 entries hold them all at a few KB each.
compile_cache_entries_max = 1_024

#: Longest offending token quoted in an error message, so that an error never echoes
#: a megabyte string back to the client.
error_token_chars_max = 40
