// railyardd: the per-node collective communication daemon, as installed: no test hooks.
#include "daemon/daemon_main.h"

int main(int argc, char** argv) { return railyard::RunDaemon(argc, argv, railyard::TestHooks{}); }
