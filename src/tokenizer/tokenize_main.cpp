// fb_tokenize: stand-alone binary for `flashbox tokenize` (tests and scripts use it until the
// subcommand is wired into src/cmd). Everything lives in run_tokenize_command.
#include "tokenizer/tokenize_command.h"

int main(int argc, char** argv) { return fb::tokenizer::run_tokenize_command(argc, argv); }
