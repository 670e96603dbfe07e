#include "model.h"
int main(void) { return 0; }
