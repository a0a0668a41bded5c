// A part at the bottom of the fixture's two-part library.
#pragma once
