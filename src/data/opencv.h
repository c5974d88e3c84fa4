#pragma once
// OpenCV 4.6's headers trip C++20's -Wdeprecated-enum-enum-conversion; include them through here
// so the warning is silenced for OpenCV's code only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-enum-enum-conversion"
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#pragma GCC diagnostic pop
