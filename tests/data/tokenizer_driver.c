/* tt_tokenizer_driver: `tetra tokenizer ...` without the Lua host, so the parity tests
** depend only on the engine library. Arguments are those after `tetra tokenizer`. */
#include "tetra_data.h"

int main(int argc, char **argv) { return tt_tokenizer_cli(argc, argv); }
