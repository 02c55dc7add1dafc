// `flashbox tokenize`: the command-line face of the tokenizer (issue 4). Reads all of stdin as
// one text and prints the ids space-separated, or with --decode reads ids and prints the text.
// Owns argument parsing for this subcommand only; no global state.
#pragma once

namespace fb::tokenizer {

// argv[0] is the subcommand name (or program name) and is ignored; flags follow:
//   --tokenizer PATH   tokenizer.json (required)
//   --decode           stdin holds ids (whitespace separated); prints the decoded text
//   --skip-special     with --decode: drop special tokens
//   --no-added         encode added-token strings as plain text
//   --jsonl            batch mode: every stdin line is a JSON string; one output line of ids each
//   --engram-map OUT   write the Engram map (int32 LE) to OUT and print classes and sha256
// Returns the process exit code: 0 ok, 1 input or I/O error, 2 usage error.
int run_tokenize_command(int argc, char** argv);

}  // namespace fb::tokenizer
